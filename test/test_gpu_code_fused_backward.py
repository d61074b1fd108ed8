"""fused_conv_backward (the fused route's backward on tables, no host read) through the GPU code on the CPU: the
same bits as the route it replaces (fused_conv on the reversed map's tables with transposed filters, and
fused_conv_dfilter on the pairs), for submanifold maps (mirrored forward table) and regular / transposed convs
(the builder's in->out table), every dtype, split-K included, in every build variant; the CPU reference within
tolerance; the tables' checks."""
import pytest
import torch

from spconv.pytorch import _fused  # noqa: F401  (the ops' fake kernels, which opcheck runs)

from conftest import hip_cpu_library, thread_order
from support.conv_cases import MAPS, TOL, Maps, fused_inputs, map_geometry, rel_err

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (map, cin, cout): mirrored SubM maps (kvol 27, 125, dilated), an even SubM kernel (not mirrored), strided and
# transposed convs; channels past one tile and not multiples of 8.
CASES = [("subm3", 40, 72), ("subm5_kvol125", 8, 16), ("dilated", 13, 7), ("subm2d_k12", 5, 7),
         ("conv_s2", 33, 65), ("conv_k2s2", 16, 24), ("deconv", 24, 40)]


def built_map(ops, name):
    """(maps, table, table rows are outputs, map_info) from the GPU code's builder."""
    idx, args = map_geometry(**MAPS[name])
    out_idx, pin, pout, poff, info, table = ops.get_indice_pairs(idx, *args)
    subm = MAPS[name].get("subm", True)
    return Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0]), table, subm, info


def mirrored(name):
    ks = MAPS[name]["ksize"]
    return MAPS[name].get("subm", True) and all(k % 2 == 1 for k in (ks if isinstance(ks, tuple) else [ks]))


def backward_both_ways(ops, m, table, by_output, info, x, w, dy, mirror, splits=1, use_info=True):
    """(new dx, new dw), (old dx, old dw)."""
    rev = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, splits)
    old = (ops.fused_conv(dy, w.transpose(1, 2).contiguous(), *rev),
           ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets))
    if mirror:
        nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 1)
    elif by_output:
        nbr, masks, order = rev
    else:
        nbr, masks, order = (table, *ops.fused_map_masks(table, splits))
    new = ops.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, table, by_output, m.pair_offsets, True, True,
                                  info if use_info else None)
    return new, old


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_bits_as_the_pairs_route(hip_cpu, case, dtype):
    name, cin, cout = case
    m, table, by_output, info = built_map(hip_cpu, name)
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    for use_info in (True, False):
        new, old = backward_both_ways(hip_cpu, m, table, by_output, info, x, w, dy, mirrored(name),
                                      use_info=use_info)
        for what, a, b in zip(("dinput", "dfilter"), new, old):
            assert a.dtype == b.dtype == dtype and a.shape == b.shape, what
            assert torch.equal(a, b), "%s %s: %d values differ" % (name, what, (a != b).sum().item())
    ref = cpu.fused_conv_backward(x, w, dy, *backward_args(hip_cpu, m, table, by_output, name))
    for what, a, r in zip(("dinput", "dfilter"), new, ref):
        assert rel_err(a, r) < TOL[dtype], "%s %s against the CPU reference: %g" % (name, what, rel_err(a, r))


def backward_args(ops, m, table, by_output, name):
    mirror = mirrored(name)
    if mirror:
        t = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 1)
    else:
        t = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, 1)
    return (*t, mirror, table, by_output, m.pair_offsets, True, True)


def test_split_k_same_bits(hip_cpu):
    """More than 4096 pairs per offset: the split count comes from the device's pair_offsets (here 3 chunks per
    offset), the chunks are the pairs route's."""
    idx, args = map_geometry(shape=[20, 20, 20], batch=1, n=7800, ksize=(1, 1, 2))
    out_idx, pin, pout, poff, info, table = hip_cpu.get_indice_pairs(idx, *args)
    m = Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0])
    assert (poff[1:] - poff[:-1]).min().item() > 3 * 2048
    x, w, dy = fused_inputs(m, 8, 12, torch.float32)
    new, old = backward_both_ways(hip_cpu, m, table, True, info, x, w, dy, False)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])


@pytest.mark.parametrize("variant, order", [(v, o) for v in ("wmma", "mfma", "sm80") for o in ("ascending",
                                                                                               "descending")])
@pytest.mark.parametrize("name", ["subm3", "conv_s2"])
def test_variants_same_bits_as_simt(hip_cpu, variant, order, name):
    m, table, by_output, info = built_map(hip_cpu, name)
    x, w, dy = fused_inputs(m, 40, 24, torch.float16)
    args = (x, w, dy, *backward_args(hip_cpu, m, table, by_output, name), info)
    simt = hip_cpu.fused_conv_backward(*args)
    with thread_order(order, variant):
        got = hip_cpu_library(variant).fused_conv_backward(*args)
    for what, g, s in zip(("dinput", "dfilter"), got, simt):
        assert torch.equal(g.view(torch.int16), s.view(torch.int16)), "%s %s differs from SIMT" % (variant, what)


def test_only_what_is_asked(hip_cpu):
    m, table, by_output, info = built_map(hip_cpu, "subm3")
    x, w, dy = fused_inputs(m, 8, 16, torch.float32)
    args = backward_args(hip_cpu, m, table, by_output, "subm3")
    full = hip_cpu.fused_conv_backward(x, w, dy, *args, info)
    dx, dw = hip_cpu.fused_conv_backward(x, w, dy, *args[:-2], True, False, info)
    assert torch.equal(dx, full[0]) and dw.numel() == 0
    dx, dw = hip_cpu.fused_conv_backward(x, w, dy, *args[:-2], False, True, info)
    assert dx.numel() == 0 and torch.equal(dw, full[1])


def test_bad_tables_raise(hip_cpu):
    m, table, by_output, info = built_map(hip_cpu, "subm3")
    x, w, dy = fused_inputs(m, 8, 16, torch.float32)
    nbr, masks, order, mirror, _, _, poff, _, _ = backward_args(hip_cpu, m, table, by_output, "subm3")
    bad = table.clone()
    bad[3, 4] = m.num_in + 5
    with pytest.raises(ValueError, match="dw_table holds rows outside"):
        hip_cpu.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, bad, True, poff, False, True)
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        hip_cpu.fused_conv_backward(x, w, dy, bad, masks, order, mirror, table, True, poff, True, False)
    with pytest.raises(ValueError, match="dw_table must have one row per output"):
        hip_cpu.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, table[1:], True, poff, True, True)
    with pytest.raises(ValueError, match="mirrored tables need one split"):
        two = hip_cpu.fused_map_masks(nbr, 2)
        hip_cpu.fused_conv_backward(x, w, dy, nbr, *two, True, table, True, poff, True, True)
    with pytest.raises(ValueError, match="pair_offsets must be"):
        hip_cpu.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, table, True, poff[:-1], True, True)


def test_opcheck_cpu_reference():
    idx, args = map_geometry(**MAPS["subm3"])
    out_idx, pin, pout, poff, info, table = cpu.get_indice_pairs(idx, *args)
    m = Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0])
    x, w, dy = fused_inputs(m, 4, 6, torch.float32)
    nbr, masks, order = cpu.build_fused_map(pin, pout, poff, m.num_out, 1)
    torch.library.opcheck(cpu.fused_conv_backward.default,
                          (x, w, dy, nbr, masks, order, True, table, True, poff, True, True, info))
