"""Duplicate input coordinates on the routes that can't sum two pairs of one (row, offset) in one pass.

A regular / transposed conv or a pool over duplicate coordinates gives an output two pairs at one offset; the
native CPU route sums them (the duplicates act as one site holding their summed features). The fused tables
hold one input per (output, offset) and the GPU scatter / pool kernels update a row once per offset, so those
maps run as rounds (spconv.pytorch.pair_rounds). Compared here against the native CPU route on the same maps.
"""
import pytest
import torch

import spconv._backend  # noqa: F401
from spconv.pytorch import _route, pair_rounds
from spconv.pytorch.core import PairMaps


ops = torch.ops.spconv


def dup_indices(shape, n, dups, seed=0):
    """n distinct sites of one batch, then `dups` extra rows repeating some of them (rows interleaved)."""
    g = torch.Generator().manual_seed(seed)
    vol = 1
    for s in shape:
        vol *= s
    flat = torch.randperm(vol, generator=g)[:n]
    flat = torch.cat([flat, flat[torch.randperm(n, generator=g)[:dups]]])
    flat = flat[torch.randperm(flat.numel(), generator=g)]
    cols = []
    for s in reversed(shape):
        cols.append(flat % s)
        flat = flat // s
    return torch.cat([torch.zeros(len(cols[0]), 1, dtype=torch.long), torch.stack(cols[::-1], 1)], 1).int()


def conv_map(idx, shape, ksize=3, stride=2, padding=1, transpose=False, op=ops):
    nd = len(shape)
    if transpose:
        out_shape = [(s - 1) * stride - 2 * padding + ksize for s in shape]
    else:
        out_shape = [(s + 2 * padding - (ksize - 1) - 1) // stride + 1 for s in shape]
    out_idx, pin, pout, poff, _, _ = op.get_indice_pairs(idx, 1, list(shape), out_shape, [ksize] * nd, [stride] * nd,
                                                   [padding] * nd, [1] * nd, False, transpose)
    return out_idx, PairMaps(pin, pout, poff, idx.shape[0], out_idx.shape[0])


def offset_keys(maps, side):
    k = torch.repeat_interleave(torch.arange(maps.pair_offsets.numel() - 1), maps.pair_counts())
    rows = maps.pair_out if side == "out" else maps.pair_in
    return k * 100000 + rows.long()


@pytest.mark.parametrize("transpose", [False, True])
def test_rounds_partition_the_pairs_without_repeats(transpose):
    idx = dup_indices([7, 6, 5], 60, 15, seed=1)
    _, maps = conv_map(idx, [7, 6, 5], transpose=transpose)
    assert offset_keys(maps, "out").unique().numel() < maps.pair_in.numel()  # the map does repeat outputs
    parts = pair_rounds.split_rounds(maps)
    assert len(parts) >= 2
    for p in parts:
        for side in ("out", "in"):
            keys = offset_keys(p, side)
            assert keys.unique().numel() == keys.numel()
    def triples(m):
        k = torch.repeat_interleave(torch.arange(m.pair_offsets.numel() - 1), m.pair_counts())
        return sorted(zip(k.tolist(), m.pair_in.tolist(), m.pair_out.tolist()))
    assert sorted(t for p in parts for t in triples(p)) == triples(maps)
    # cached, and shared with the reversed map
    assert pair_rounds.split_rounds(maps) is parts
    assert [p.pair_in.data_ptr() for p in pair_rounds.split_rounds(maps.reversed())] == \
        [p.pair_out.data_ptr() for p in parts]


def test_unique_coordinates_are_one_round():
    idx = dup_indices([7, 6, 5], 60, 0)
    _, maps = conv_map(idx, [7, 6, 5])
    assert pair_rounds.split_rounds(maps) == [maps]


def native_reference(x, w, maps):
    x = x.detach().clone().requires_grad_(True)
    w = w.detach().clone().requires_grad_(True)
    y = ops.indice_conv(x, w, maps.pair_in, maps.pair_out, maps.pair_offsets, maps.num_out)
    return y, x, w


@pytest.mark.parametrize("transpose", [False, True])
@pytest.mark.parametrize("inverse", [False, True])
def test_fused_cpu_reference_sums_duplicates(transpose, inverse):
    """Before: the table kept one duplicate, so its contribution vanished from the forward."""
    idx = dup_indices([7, 6, 5], 60, 15, seed=2)
    _, maps = conv_map(idx, [7, 6, 5], transpose=transpose)
    if inverse:
        maps = maps.reversed()
    g = torch.Generator().manual_seed(3)
    x = torch.randn(maps.num_in, 5, generator=g)
    w = torch.randn(27, 5, 4, generator=g)
    dy = torch.randn(maps.num_out, 4, generator=g)
    y_ref, xr, wr = native_reference(x, w, maps)
    y_ref.backward(dy)
    xf, wf = x.clone().requires_grad_(True), w.clone().requires_grad_(True)
    y = _route.fused_conv_unchecked(xf, wf, maps)
    y.backward(dy)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(xf.grad, xr.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(wf.grad, wr.grad, rtol=1e-5, atol=1e-5)


def test_build_fused_map_rejects_repeated_outputs_cpu():
    """Before: the CPU reference table silently kept the last of the two pairs."""
    idx = dup_indices([7, 6, 5], 60, 15, seed=4)
    _, maps = conv_map(idx, [7, 6, 5])
    with pytest.raises(ValueError, match="share an output row"):
        ops.build_fused_map(maps.pair_in, maps.pair_out, maps.pair_offsets, maps.num_out, 1)


# ---- the GPU code, run on the CPU (HIP CPU runtime) ----

def many_block_dup_map():
    """Duplicates far apart in row order, so the colliding pairs sit in different blocks of 256 threads."""
    shape = [24, 24, 24]
    idx = dup_indices(shape, 1500, 0, seed=5)
    idx = torch.cat([idx, idx[:400]])  # rows r and r + 1500 share a coordinate
    return conv_map(idx, shape)


@pytest.mark.hip_cpu
def test_hip_cpu_build_fused_map_rejects_repeated_outputs(hip_cpu):
    """Before: map_fill_kernel kept the last writer of each (output, offset): one duplicate vanished."""
    hc = hip_cpu
    _, maps = many_block_dup_map()
    with pytest.raises(ValueError, match="share an output row"):
        hc.build_fused_map(maps.pair_in, maps.pair_out, maps.pair_offsets, maps.num_out, 1)


@pytest.mark.slow
@pytest.mark.hip_cpu
@pytest.mark.parametrize("inverse", [False, True])
def test_hip_cpu_rounds_match_cpu(inverse, hip_cpu):
    """Fused and native GPU routes over the rounds equal the CPU route over the whole map (fwd, dinput, dfilter)."""
    hc = hip_cpu
    _, maps = many_block_dup_map()
    if inverse:
        maps = maps.reversed()
    g = torch.Generator().manual_seed(6)
    x = torch.randn(maps.num_in, 8, generator=g)
    w = torch.randn(27, 8, 8, generator=g)
    dy = torch.randn(maps.num_out, 8, generator=g)
    y_ref = ops.indice_conv(x, w, maps.pair_in, maps.pair_out, maps.pair_offsets, maps.num_out)
    dx_ref, dw_ref = ops.indice_conv_backward(x, w, dy, maps.pair_in, maps.pair_out, maps.pair_offsets)
    parts = pair_rounds.split_rounds(maps)
    assert len(parts) >= 2
    y_nat = sum(hc.indice_conv(x, w, p.pair_in, p.pair_out, p.pair_offsets, p.num_out) for p in parts)
    grads = [hc.indice_conv_backward(x, w, dy, p.pair_in, p.pair_out, p.pair_offsets) for p in parts]
    y_fused = 0
    for p in parts:
        nbr, masks, order = hc.build_fused_map(p.pair_in, p.pair_out, p.pair_offsets, p.num_out, 1)
        y_fused = y_fused + hc.fused_conv(x, w, nbr, masks, order)
    tol = dict(rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(y_nat, y_ref, **tol)
    torch.testing.assert_close(y_fused, y_ref, **tol)
    torch.testing.assert_close(sum(d for d, _ in grads), dx_ref, **tol)
    torch.testing.assert_close(sum(d for _, d in grads), dw_ref, **tol)


# ---- whole layers, the GPU route run on the CPU ----

def _layers_out(idx, feats, layer, shape):
    from spconv.pytorch.core import SparseConvTensor
    x = feats.clone().requires_grad_(True)
    y = layer(SparseConvTensor(x, idx, shape, 1))
    y.features.backward(torch.ones_like(y.features) * torch.arange(y.features.shape[1]).float())
    return y.indices, y.features.detach(), x.grad


@pytest.mark.hip_cpu
@pytest.mark.parametrize("kind", ["conv", "inverse", "maxpool", "avgpool"])
def test_layers_on_gpu_route_sum_duplicates(kind, hip_cpu):
    """SparseConv3d / SparseInverseConv3d / pools over duplicate coordinates: the GPU route (fused and native
    conv, pools) equals the CPU route. Before: the fused forward dropped a duplicate."""
    import spconv.pytorch as spconv
    from spconv import _backend

    shape = [24, 24, 24]
    idx = dup_indices(shape, 1500, 0, seed=7)
    idx = torch.cat([idx, idx[:400]])
    g = torch.Generator().manual_seed(8)
    feats = torch.randn(idx.shape[0], 8, generator=g)
    torch.manual_seed(0)
    if kind in ("conv", "inverse"):
        down = spconv.SparseConv3d(8, 8, 3, stride=2, padding=1, bias=False, indice_key="d")
        layer = down
        if kind == "inverse":
            up = spconv.SparseInverseConv3d(8, 8, 3, indice_key="d", bias=False)
            layer = lambda t: up(down(t))  # noqa: E731
    elif kind == "maxpool":
        layer = spconv.SparseMaxPool3d(3, stride=2, padding=1)
    else:
        layer = spconv.SparseAvgPool3d(3, stride=2, padding=1)
    ref = _layers_out(idx, feats, layer, shape)  # the CPU route
    with _backend.gpu_code_on_cpu(hip_cpu.name):
        got = _layers_out(idx, feats, layer, shape)
    assert torch.equal(got[0], ref[0])
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[2], ref[2], rtol=1e-5, atol=1e-5)
