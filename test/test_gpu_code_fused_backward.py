"""fused_conv_backward (the fused route's backward on tables, no host read) wherever the GPU code runs
(``gpu_place``: the HIP CPU build, and a GPU when there is one): the same bits as the route it replaces (fused_conv
on the reversed map's tables with transposed filters, and fused_conv_dfilter on the pairs), for submanifold maps
(mirrored forward table) and regular / transposed convs (the builder's in->out table), every dtype, split-K
included; the CPU reference within tolerance; only dinput or dfilter when asked; the tables' checks. Only on the
HIP CPU build: the emulated variants (wmma, mfma, sm80) bit for bit against the SIMT body."""
import pytest
import torch

from spconv.pytorch import _fused  # noqa: F401  (the ops' fake kernels, which opcheck runs)

from conftest import hip_cpu_library, thread_order
from support.conv_cases import MAPS, TOL, Maps, fused_inputs, map_geometry, rel_err
from support.places import Place

cpu = torch.ops.spconv
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# (map, cin, cout): mirrored SubM maps (kvol 27, 125, dilated), an even SubM kernel (not mirrored), strided and
# transposed convs; channels past one tile and not multiples of 8.
CASES = [("subm3", 40, 72), ("subm5_kvol125", 8, 16), ("dilated", 13, 7), ("subm2d_k12", 5, 7),
         ("conv_s2", 33, 65), ("conv_k2s2", 16, 24), ("deconv", 24, 40)]


def built_map(place, name):
    """(maps, table, table rows are outputs, map_info) from the GPU code's builder at the place (map_info, the host
    record, on the host)."""
    idx, args = map_geometry(**MAPS[name])
    out_idx, pin, pout, poff, info, table = place.ops.get_indice_pairs(place.to(idx), *args)
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


def operands(place, m, cin, cout, dtype):
    """(features, filters, output gradient) made on the CPU, at the place."""
    return tuple(place.to(t) for t in fused_inputs(m, cin, cout, dtype))


def on_cpu(args):
    return [a.cpu() if isinstance(a, torch.Tensor) else a for a in args]


@pytest.mark.parametrize("dtype", DTYPES, ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_same_bits_as_the_pairs_route(gpu_place, case, dtype):
    name, cin, cout = case
    ops = gpu_place.ops
    m, table, by_output, info = built_map(gpu_place, name)
    x, w, dy = operands(gpu_place, m, cin, cout, dtype)
    for use_info in (True, False):
        new, old = backward_both_ways(ops, m, table, by_output, info, x, w, dy, mirrored(name), use_info=use_info)
        for what, a, b in zip(("dinput", "dfilter"), new, old):
            assert a.dtype == b.dtype == dtype and a.shape == b.shape, what
            assert torch.equal(a, b), "%s %s: %d values differ" % (name, what, (a != b).sum().item())
    # the CPU op on the same operands and the GPU code's tables
    ref = cpu.fused_conv_backward(*on_cpu((x, w, dy, *backward_args(ops, m, table, by_output, name))))
    for what, a, r in zip(("dinput", "dfilter"), on_cpu(new), ref):
        assert rel_err(a, r) < TOL[dtype], "%s %s against the CPU reference: %g" % (name, what, rel_err(a, r))


def backward_args(ops, m, table, by_output, name):
    mirror = mirrored(name)
    if mirror:
        t = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 1)
    else:
        t = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, 1)
    return (*t, mirror, table, by_output, m.pair_offsets, True, True)


def test_split_k_same_bits(gpu_place):
    """More than 4096 pairs per offset: the split count comes from the device's pair_offsets (here 3 chunks per
    offset), the chunks are the pairs route's."""
    idx, args = map_geometry(shape=[20, 20, 20], batch=1, n=7800, ksize=(1, 1, 2))
    out_idx, pin, pout, poff, info, table = gpu_place.ops.get_indice_pairs(gpu_place.to(idx), *args)
    m = Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0])
    assert (poff[1:] - poff[:-1]).min().item() > 3 * 2048
    x, w, dy = operands(gpu_place, m, 8, 12, torch.float32)
    new, old = backward_both_ways(gpu_place.ops, m, table, True, info, x, w, dy, False)
    assert torch.equal(new[0], old[0]) and torch.equal(new[1], old[1])


# The HIP CPU build alone: the emulated matrix-core bodies (tools/hip_cpu_build.py variants) in both thread orders;
# a GPU runs its own body in the tests above.
@pytest.mark.parametrize("variant, order", [(v, o) for v in ("wmma", "mfma", "sm80") for o in ("ascending",
                                                                                               "descending")])
@pytest.mark.parametrize("name", ["subm3", "conv_s2"])
def test_variants_same_bits_as_simt(hip_cpu, variant, order, name):
    m, table, by_output, info = built_map(Place("hip_cpu", hip_cpu), name)
    x, w, dy = fused_inputs(m, 40, 24, torch.float16)
    args = (x, w, dy, *backward_args(hip_cpu, m, table, by_output, name), info)
    simt = hip_cpu.fused_conv_backward(*args)
    with thread_order(order, variant):
        got = hip_cpu_library(variant).fused_conv_backward(*args)
    for what, g, s in zip(("dinput", "dfilter"), got, simt):
        assert torch.equal(g.view(torch.int16), s.view(torch.int16)), "%s %s differs from SIMT" % (variant, what)


def test_only_what_is_asked(gpu_place):
    ops = gpu_place.ops
    m, table, by_output, info = built_map(gpu_place, "subm3")
    x, w, dy = operands(gpu_place, m, 8, 16, torch.float32)
    args = backward_args(ops, m, table, by_output, "subm3")
    full = ops.fused_conv_backward(x, w, dy, *args, info)
    dx, dw = ops.fused_conv_backward(x, w, dy, *args[:-2], True, False, info)
    assert torch.equal(dx, full[0]) and dw.numel() == 0
    dx, dw = ops.fused_conv_backward(x, w, dy, *args[:-2], False, True, info)
    assert dx.numel() == 0 and torch.equal(dw, full[1])


def test_bad_tables_raise(gpu_place):
    ops = gpu_place.ops
    m, table, by_output, info = built_map(gpu_place, "subm3")
    x, w, dy = operands(gpu_place, m, 8, 16, torch.float32)
    nbr, masks, order, mirror, _, _, poff, _, _ = backward_args(ops, m, table, by_output, "subm3")
    bad = table.clone()
    bad[3, 4] = m.num_in + 5
    with pytest.raises(ValueError, match="dw_table holds rows outside"):
        ops.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, bad, True, poff, False, True)
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        ops.fused_conv_backward(x, w, dy, bad, masks, order, mirror, table, True, poff, True, False)
    with pytest.raises(ValueError, match="dw_table must have one row per output"):
        ops.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, table[1:], True, poff, True, True)
    with pytest.raises(ValueError, match="mirrored tables need one split"):
        two = ops.fused_map_masks(nbr, 2)
        ops.fused_conv_backward(x, w, dy, nbr, *two, True, table, True, poff, True, True)
    with pytest.raises(ValueError, match="pair_offsets must be"):
        ops.fused_conv_backward(x, w, dy, nbr, masks, order, mirror, table, True, poff[:-1], True, True)


@pytest.mark.hip_cpu  # no GPU code: the CPU op's registration, run with this file's HIP CPU cases as before
def test_opcheck_cpu_reference():
    idx, args = map_geometry(**MAPS["subm3"])
    out_idx, pin, pout, poff, info, table = cpu.get_indice_pairs(idx, *args)
    m = Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0])
    x, w, dy = fused_inputs(m, 4, 6, torch.float32)
    nbr, masks, order = cpu.build_fused_map(pin, pout, poff, m.num_out, 1)
    torch.library.opcheck(cpu.fused_conv_backward.default,
                          (x, w, dy, nbr, masks, order, True, table, True, poff, True, True, info))
