"""The fused route's ops on the CPU (reference kernels with the GPU kernels' exact semantics, masks and
splits included) against the native route and dense math: forward, dinput, dfilter, tables, opcheck."""
import itertools

import pytest
import torch
import torch.nn.functional as F

import spconv._backend  # noqa: F401
from spconv.pytorch import _fused, _route
from support.conv_cases import FUSED_CPU_CASES, Maps, map_geometry, native_backward, sorted_pairs

ops = torch.ops.spconv


def make_map(shape, batch, n, ksize, stride=1, padding=0, dilation=1, subm=True, transpose=False, seed=0):
    idx, args = map_geometry(shape, batch, n, ksize, stride, padding, dilation, subm, transpose, seed)
    out_idx, pin, pout, poff, _, _ = ops.get_indice_pairs(idx, *args)
    return idx, out_idx, Maps(pin, pout, poff, idx.shape[0], out_idx.shape[0])


def tables_to_pairs(nbr):
    """Pairs grouped by offset, rows ascending, from the out->in table."""
    kvol = nbr.shape[1]
    pin, pout, off = [], [], [0]
    for k in range(kvol):
        rows = torch.nonzero(nbr[:, k] >= 0).flatten()
        pout.append(rows)
        pin.append(nbr[rows, k].long())
        off.append(off[-1] + rows.numel())
    return torch.cat(pin), torch.cat(pout), torch.tensor(off)


@pytest.mark.parametrize("case", sorted(FUSED_CPU_CASES))
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_build_fused_map(case, splits):
    _, _, m = make_map(**FUSED_CPU_CASES[case])
    kvol = m.pair_offsets.numel() - 1
    if splits > kvol:
        pytest.skip("more splits than offsets")
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, splits)
    assert nbr.shape == (m.num_out, kvol) and nbr.dtype == torch.int32
    assert masks.shape == order.shape == (splits, m.num_out)
    # the table holds exactly the pairs
    pin, pout, poff = tables_to_pairs(nbr)
    for a, b in zip(sorted_pairs(pin, pout, poff), sorted_pairs(m.pair_in, m.pair_out, m.pair_offsets)):
        assert torch.equal(a, b)
    for s in range(splits):
        k0, k1 = s * kvol // splits, (s + 1) * kvol // splits
        gs = max(1, (k1 - k0 + 31) // 32)
        expect = torch.zeros(m.num_out, dtype=torch.int64)
        for k in range(k0, k1):
            expect |= (nbr[:, k] >= 0).long() << ((k - k0) // gs)
        got = masks[s].long() & 0xFFFFFFFF
        assert torch.equal(got, expect)
        # order: a permutation, stably sorted by unsigned mask
        o = order[s].long()
        assert torch.equal(torch.sort(o).values, torch.arange(m.num_out))
        key = got[o] * m.num_out + o
        assert torch.all(key[1:] > key[:-1])


def native(features, filters, m):
    """Gather -> GEMM -> scatter in plain torch (independent of the extension's native route)."""
    out = torch.zeros(m.num_out, filters.shape[2], dtype=features.dtype)
    for k in range(filters.shape[0]):
        a, b = int(m.pair_offsets[k]), int(m.pair_offsets[k + 1])
        pin, pout = m.pair_in[a:b].long(), m.pair_out[a:b].long()
        out.index_add_(0, pout, features[pin] @ filters[k])
    return out


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(FUSED_CPU_CASES))
@pytest.mark.parametrize("splits", [1, 2])
@pytest.mark.parametrize("channels", [(3, 5), (16, 16), (8, 70)])
def test_forward_dinput_dfilter_fp64(case, splits, channels):
    cin, cout = channels
    _, _, m = make_map(**FUSED_CPU_CASES[case])
    kvol = m.pair_offsets.numel() - 1
    if splits > kvol:
        pytest.skip("more splits than offsets")
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m.num_in, cin, generator=g, dtype=torch.float64)
    w = torch.randn(kvol, cin, cout, generator=g, dtype=torch.float64)
    dy = torch.randn(m.num_out, cout, generator=g, dtype=torch.float64)
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, splits)
    y = ops.fused_conv(x, w, nbr, masks, order)
    torch.testing.assert_close(y, native(x, w, m), rtol=1e-10, atol=1e-10)
    # dinput: the same kernel over the reversed map with filters [kvol, Cout, Cin]
    rn, rm, ro = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, splits)
    dx = ops.fused_conv(dy, w.transpose(1, 2).contiguous(), rn, rm, ro)
    dx_ref, dw_ref = native_backward(x, w, dy, m)
    torch.testing.assert_close(dx, dx_ref, rtol=1e-10, atol=1e-10)
    dw = ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    torch.testing.assert_close(dw, dw_ref, rtol=1e-10, atol=1e-10)


def test_subm_matches_dense_conv3d():
    shape, cin, cout = [5, 6, 7], 3, 4
    idx, _, m = make_map(shape, 1, 90, 3, seed=3)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(m.num_in, cin, generator=g, dtype=torch.float64)
    weight = torch.randn(cout, 3, 3, 3, cin, generator=g, dtype=torch.float64)  # spconv 2.x KRSC
    filters = weight.reshape(cout, 27, cin).permute(1, 2, 0).contiguous()
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2)
    y = ops.fused_conv(x, filters, nbr, masks, order)
    dense = torch.zeros(1, cin, *shape, dtype=torch.float64)
    i = idx.long()
    dense[i[:, 0], :, i[:, 1], i[:, 2], i[:, 3]] = x
    ref = F.conv3d(dense, weight.permute(0, 4, 1, 2, 3), padding=1)
    ref = ref[i[:, 0], :, i[:, 1], i[:, 2], i[:, 3]]
    torch.testing.assert_close(y, ref, rtol=1e-10, atol=1e-10)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("case", ["subm3", "conv_s2", "deconv", "subm5_kvol125"])
def test_low_precision_against_fp32(dtype, case):
    cin, cout = 32, 48
    _, _, m = make_map(**FUSED_CPU_CASES[case])
    kvol = m.pair_offsets.numel() - 1
    g = torch.Generator().manual_seed(4)
    x = torch.randn(m.num_in, cin, generator=g)
    w = torch.randn(kvol, cin, cout, generator=g) / (cin ** 0.5)
    dy = torch.randn(m.num_out, cout, generator=g)
    ref = native(x, w, m)
    ref_dx, ref_dw = native_backward(x, w, dy, m)
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2)
    rn, rm, ro = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, 2)
    xt, wt, dyt = x.to(dtype), w.to(dtype), dy.to(dtype)
    y = ops.fused_conv(xt, wt, nbr, masks, order)
    dx = ops.fused_conv(dyt, wt.transpose(1, 2).contiguous(), rn, rm, ro)
    dw = ops.fused_conv_dfilter(xt, dyt, m.pair_in, m.pair_out, m.pair_offsets)
    assert y.dtype == dx.dtype == dw.dtype == dtype
    tol = 10 * max(1, max(cin, cout) / 16)
    if dtype == torch.float32:
        torch.testing.assert_close(y, ref, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dx, ref_dx, rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(dw, ref_dw, rtol=1e-4, atol=1e-4)
    else:
        assert torch.linalg.norm(y.float() - ref) < tol
        assert torch.linalg.norm(dx.float() - ref_dx) < tol
        assert torch.linalg.norm(dw.float() - ref_dw) < tol


def test_masks_are_honoured():
    """A cleared mask bit skips the offset even when the table has a neighbour (as the GPU kernel does)."""
    _, _, m = make_map(**FUSED_CPU_CASES["subm3"])
    x = torch.randn(m.num_in, 4, dtype=torch.float64)
    w = torch.randn(27, 4, 4, dtype=torch.float64)
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 1)
    masks0 = masks & ~(1 << 13)  # drop the centre offset
    y = ops.fused_conv(x, w, nbr, masks0, order)
    keep = torch.ones(27, dtype=torch.bool)
    keep[13] = False
    ref = ops.fused_conv(x, w * keep[:, None, None], nbr, masks, order)
    torch.testing.assert_close(y, ref)


def test_empty():
    pin = torch.zeros(0, dtype=torch.int32)
    poff = torch.zeros(28, dtype=torch.int64)
    nbr, masks, order = ops.build_fused_map(pin, pin, poff, 5, 2)
    assert torch.all(nbr == -1) and torch.all(masks == 0)
    y = ops.fused_conv(torch.randn(0, 3), torch.randn(27, 3, 4), nbr, masks, order)
    assert y.shape == (5, 4) and torch.all(y == 0)
    n0, m0, o0 = ops.build_fused_map(pin, pin, poff, 0, 1)
    assert n0.shape == (0, 27) and m0.shape == o0.shape == (1, 0)
    assert ops.fused_conv(torch.randn(0, 3), torch.randn(27, 3, 4), n0, m0, o0).shape == (0, 4)
    dw = ops.fused_conv_dfilter(torch.randn(0, 3), torch.randn(0, 4), pin, pin, poff)
    assert dw.shape == (27, 3, 4) and torch.all(dw == 0)


def test_bad_arguments():
    _, _, m = make_map(**FUSED_CPU_CASES["subm3"])
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 1)
    x = torch.randn(m.num_in, 4)
    with pytest.raises(ValueError, match="filters"):
        ops.fused_conv(x, torch.randn(26, 4, 4), nbr, masks, order)
    with pytest.raises(TypeError, match="dtype"):
        ops.fused_conv(x, torch.randn(27, 4, 4, dtype=torch.float64), nbr, masks, order)
    with pytest.raises(ValueError, match="num_splits"):
        ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 0)
    with pytest.raises(ValueError, match="pair_out"):
        ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, 3, 1)
    with pytest.raises(ValueError, match="nbr holds row"):
        ops.fused_conv(x[:5], torch.randn(27, 4, 4), nbr, masks, order)
    with pytest.raises(ValueError, match="masks"):
        ops.fused_conv(x, torch.randn(27, 4, 4), nbr, masks[:, :3], order)


def test_opcheck():
    _, _, m = make_map(**FUSED_CPU_CASES["conv_s2"])
    x = torch.randn(m.num_in, 5)
    w = torch.randn(27, 5, 6)
    dy = torch.randn(m.num_out, 6)
    torch.library.opcheck(ops.build_fused_map.default, (m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2))
    nbr, masks, order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2)
    torch.library.opcheck(ops.fused_conv.default, (x, w, nbr, masks, order))
    torch.library.opcheck(ops.fused_conv_dfilter.default, (x, dy, m.pair_in, m.pair_out, m.pair_offsets))


@pytest.mark.parametrize("case", ["subm3", "conv_s2", "deconv"])
def test_autograd_function(case):
    _, _, m = make_map(**FUSED_CPU_CASES[case])
    kvol = m.pair_offsets.numel() - 1
    x = torch.randn(m.num_in, 3, dtype=torch.float64, requires_grad=True)
    w = torch.randn(kvol, 3, 4, dtype=torch.float64, requires_grad=True)
    small = make_map(**dict(FUSED_CPU_CASES[case], n=12))[2]
    xs = torch.randn(small.num_in, 2, dtype=torch.float64, requires_grad=True)
    ws = torch.randn(kvol, 2, 3, dtype=torch.float64, requires_grad=True)
    torch.autograd.gradcheck(lambda a, b: _route.fused_conv_unchecked(a, b, small, 2), (xs, ws), fast_mode=True)
    _route.fused_conv_unchecked(x, w, m, 2).sum().backward()
    x.grad = w.grad = None
    # tables cached on the map and on its reverse
    assert "fused_map_s2" in m.cache
    assert "fused_map_s2" in _fused._reversed(m).cache
    dy = torch.randn(m.num_out, 4, dtype=torch.float64)
    y = _route.fused_conv_unchecked(x, w, m)
    y.backward(dy)
    torch.testing.assert_close(y.detach(), native(x.detach(), w.detach(), m))
    dx_ref, dw_ref = native_backward(x.detach(), w.detach(), dy, m)
    torch.testing.assert_close(x.grad, dx_ref)
    torch.testing.assert_close(w.grad, dw_ref)


def test_fused_conv_policy_on_cpu():
    _, _, m = make_map(**FUSED_CPU_CASES["subm3"])
    x = torch.randn(m.num_in, 4)
    w = torch.randn(27, 4, 4)
    assert _route.fused_conv(x, w, m, m.num_out) is None  # CPU tensors never take the fused route
    assert _fused._shape_ok(x, w, m, m.num_out)
    assert not _fused._shape_ok(x.double(), w.double(), m, m.num_out)
    assert not _fused._shape_ok(x, w[:1], m, m.num_out)
    assert ops.fused_conv_path(x) == "reference"


def test_compile_traces_fused_ops():
    _, _, m = make_map(**FUSED_CPU_CASES["subm3"])
    x = torch.randn(m.num_in, 4)
    w = torch.randn(27, 4, 4)

    def f(x, w, pin, pout, poff):
        nbr, masks, order = ops.build_fused_map(pin, pout, poff, m.num_out, 1)
        return ops.fused_conv(x, w, nbr, masks, order)

    ref = f(x, w, m.pair_in, m.pair_out, m.pair_offsets)
    got = torch.compile(f, backend="eager", fullgraph=True)(x, w, m.pair_in, m.pair_out, m.pair_offsets)
    torch.testing.assert_close(got, ref)
