"""Sparse pooling against dense PyTorch on the densified tensor: forward and dinput."""
import pytest
import torch
import torch.nn.functional as F

import spconv.pytorch as spconv
from spconv.pytorch.pool import SparseMaxPool
from support.pool_cases import DENSE_CASES, DENSE_SHAPES, case_id, dense_window_sum
from support.surface import gather_sites, make_sparse, occupancy, with_features

_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
_MAX_LAYER = {1: spconv.SparseMaxPool1d, 2: spconv.SparseMaxPool2d, 3: spconv.SparseMaxPool3d}
_AVG_LAYER = {1: spconv.SparseAvgPool1d, 2: spconv.SparseAvgPool2d, 3: spconv.SparseAvgPool3d}


def _sparse_and_dense_grads(layer, x, upstream_seed=1):
    """Forward both ways; returns (sparse dense-view, sparse dinput, input, upstream)."""
    feats = x.features.clone().requires_grad_(True)
    xs = with_features(x, feats)
    y = layer(xs)
    yd = y.dense()
    g = torch.randn(yd.shape, generator=torch.Generator().manual_seed(upstream_seed), dtype=yd.dtype)
    (yd * g).sum().backward()
    return yd.detach(), feats.grad, g


@pytest.mark.parametrize("case", DENSE_CASES, ids=case_id)
def test_max_pool_matches_dense(case):
    """Positive features: the sparse pool densified equals F.max_pool on the densified input."""
    nd, k, s, p, d = case
    x = make_sparse(DENSE_SHAPES[nd], 2, 3, n=40, seed=sum(case), positive=True)
    layer = _MAX_LAYER[nd](k, s, p, d)
    yd, dx, g = _sparse_and_dense_grads(layer, x)
    xd = x.dense().clone().requires_grad_(True)
    ref = _MAXPOOL[nd](xd, k, s, p, d)
    (ref * g).sum().backward()
    torch.testing.assert_close(yd, ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", [c for c in DENSE_CASES if c[0] in (2, 3)][::3], ids=case_id)
def test_max_pool_clamps_at_zero(case):
    """Mixed signs: output = max(0, max of the active inputs), gradient only through positive maxima."""
    nd, k, s, p, d = case
    x = make_sparse(DENSE_SHAPES[nd], 2, 4, n=30, seed=sum(case) + 7)
    layer = _MAX_LAYER[nd](k, s, p, d)
    yd, dx, g = _sparse_and_dense_grads(layer, x)
    xd = x.dense().clone().requires_grad_(True)
    masked = torch.where(occupancy(x).bool(), xd, torch.full_like(xd, float("-inf")))
    ref = _MAXPOOL[nd](masked, k, s, p, d).clamp(min=0)
    (ref * g).sum().backward()
    assert (yd >= 0).all()
    torch.testing.assert_close(yd, ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("case", DENSE_CASES, ids=case_id)
def test_avg_pool_matches_dense_mean_of_active(case):
    """Avg pool = window sum / number of active sites in the window (spconv divides by the active count)."""
    nd, k, s, p, d = case
    x = make_sparse(DENSE_SHAPES[nd], 2, 3, n=40, seed=sum(case) + 3)
    layer = _AVG_LAYER[nd](k, s, p, d)
    yd, dx, g = _sparse_and_dense_grads(layer, x)
    xd = x.dense().clone().requires_grad_(True)
    count = dense_window_sum(occupancy(x), k, s, p, d)
    ref = dense_window_sum(xd, k, s, p, d) / count.clamp(min=1)
    (ref * g * (count > 0)).sum().backward()
    torch.testing.assert_close(yd, ref.detach() * (count > 0), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-4, rtol=1e-4)
    if d == 1 and p == 0:  # no dilation/padding: F.avg_pool * kernel volume / count is the same mean
        via_avg = F.__dict__[f"avg_pool{nd}d"](x.dense(), k, s) * (k ** nd) / count.clamp(min=1)
        torch.testing.assert_close(yd, via_avg * (count > 0), atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("nd", [2, 3])
def test_max_pool_ties_follow_torch_raster_order(nd):
    """Equal maxima: the gradient goes to the first input in window raster order, like F.max_pool."""
    x = make_sparse(DENSE_SHAPES[nd], 1, 2, n=60, seed=11)
    x = with_features(x, torch.ones_like(x.features))
    yd, dx, g = _sparse_and_dense_grads(_MAX_LAYER[nd](3, 2, 1, 1), x)
    xd = x.dense().clone().requires_grad_(True)
    (_MAXPOOL[nd](xd, 3, 2, 1, 1) * g).sum().backward()
    # A misrouted gradient is off by O(1); 1e-6 only absorbs the order of summing several outputs' gradients.
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-6, rtol=1e-6)


def test_max_pool_4d_matches_brute_force():
    """4D (no dense torch op): each output is max(0, max of its window's active inputs)."""
    x = make_sparse([5, 4, 4, 3], 1, 2, n=50, seed=5)
    y = spconv.SparseMaxPool4d(2, 2)(x)
    xi, yi = x.indices.long(), y.indices.long()
    for r in range(yi.shape[0]):
        inside = (xi[:, 0] == yi[r, 0]) & ((xi[:, 1:] // 2) == yi[r, 1:]).all(1)
        expect = x.features[inside].max(0).values.clamp(min=0)
        torch.testing.assert_close(y.features[r], expect)


def test_pool_result_does_not_depend_on_thread_count():
    x = make_sparse([16, 16, 16], 2, 8, n=1500, seed=3)
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            f = x.features.clone().requires_grad_(True)
            y = spconv.SparseMaxPool3d(3, 2, 1)(with_features(x, f))
            y.features.pow(2).sum().backward()
            z = spconv.SparseAvgPool3d(3, 2, 1)(x)
            results.append((y.features.detach(), f.grad, z.features))
    finally:
        torch.set_num_threads(old)
    for a, b in zip(*results):
        assert torch.equal(a, b)


@pytest.mark.parametrize("layer_cls", [spconv.SparseMaxPool3d, spconv.SparseAvgPool3d])
def test_inverse_conv_undoes_pool_through_indice_key(layer_cls):
    x = make_sparse([8, 8, 8], 2, 4, n=120, seed=4)
    pooled = layer_cls(2, 2, indice_key="pool1")(x)
    assert "pool1" in pooled.indice_dict and "pool1" not in x.indice_dict
    inv = spconv.SparseInverseConv3d(4, 5, 2, indice_key="pool1")
    up = inv(pooled)
    assert torch.equal(up.indices, x.indices)
    assert up.spatial_shape == x.spatial_shape
    # Dense check: the inverse conv is the transposed conv of the pool's geometry, read at the input sites.
    w = inv.weight.detach().permute(4, 0, 1, 2, 3)  # [Cout, *k, Cin] -> [Cin, Cout, *k] for conv_transpose
    ref = F.conv_transpose3d(pooled.dense(), w, inv.bias.detach(), stride=2)
    torch.testing.assert_close(up.features, gather_sites(ref, x.indices), atol=1e-4, rtol=1e-4)


def test_subm_max_pool_keeps_coordinates():
    x = make_sparse([6, 6], 1, 3, n=15, seed=2, positive=True)
    y = SparseMaxPool(2, 3, stride=1, padding=1, subm=True)(x)
    assert torch.equal(y.indices, x.indices)
    masked = torch.where(occupancy(x).bool(), x.dense(), torch.tensor(float("-inf")))
    ref = F.max_pool2d(masked, 3, 1, 1)
    torch.testing.assert_close(y.features, gather_sites(ref, x.indices))


@pytest.mark.parametrize("layer", [spconv.SparseMaxPool3d(2), spconv.SparseAvgPool3d(3, 2, 1)])
def test_empty_input_flows_forward_and_backward(layer):
    f = torch.zeros(0, 4, requires_grad=True)
    x = spconv.SparseConvTensor(f, torch.zeros(0, 4, dtype=torch.int32), [6, 6, 6], 2)
    y = layer(x)
    assert y.features.shape == (0, 4)
    y.features.sum().backward()
    assert f.grad.shape == (0, 4)
    assert y.dense().shape[0] == 2


@pytest.mark.parametrize("dtype", [torch.float64, torch.float16, torch.bfloat16])
def test_pool_dtypes(dtype):
    x = make_sparse([6, 6, 6], 1, 4, n=50, seed=9)
    y32 = spconv.SparseMaxPool3d(2)(x)
    y = spconv.SparseMaxPool3d(2)(with_features(x, x.features.to(dtype)))
    assert y.features.dtype == dtype
    torch.testing.assert_close(y.features.float(), y32.features.to(dtype).float())
    a = spconv.SparseAvgPool3d(2)(with_features(x, x.features.to(dtype)))
    assert a.features.dtype == dtype


def test_global_pools():
    x = make_sparse([5, 5, 5], 3, 4, n=40, seed=6)
    f = x.features.clone().requires_grad_(True)
    xs = with_features(x, f)
    gmax = spconv.SparseGlobalMaxPool()(xs)
    gavg = spconv.SparseGlobalAvgPool()(xs)
    assert gmax.shape == (3, 4) and gavg.shape == (3, 4)
    b = x.indices[:, 0].long()
    for i in range(3):
        torch.testing.assert_close(gmax[i], x.features[b == i].max(0).values)
        torch.testing.assert_close(gavg[i], x.features[b == i].mean(0))
    (gmax.sum() + 2 * gavg.sum()).backward()
    counts = torch.bincount(b, minlength=3).float()
    expect = 2 / counts[b][:, None].expand(-1, 4).clone()
    for i in range(3):
        rows = (b == i).nonzero().flatten()
        expect[rows[x.features[rows].argmax(0)], torch.arange(4)] += 1
    torch.testing.assert_close(f.grad, expect)


def test_global_pool_of_empty_batch_entry_is_zero():
    x = spconv.SparseConvTensor(torch.tensor([[-1.0, 2.0]]), torch.tensor([[1, 0, 0]], dtype=torch.int32), [2, 2], 2)
    assert torch.equal(spconv.SparseGlobalMaxPool()(x), torch.tensor([[0.0, 0.0], [-1.0, 2.0]]))
    assert torch.equal(spconv.SparseGlobalAvgPool()(x), torch.tensor([[0.0, 0.0], [-1.0, 2.0]]))


def test_pool_layer_arguments():
    layer = spconv.SparseMaxPool3d(3)
    assert layer.stride == [3, 3, 3] and layer.padding == [0, 0, 0] and layer.dilation == [1, 1, 1]
    assert spconv.SparseMaxPool2d((2, 3), (1, 2)).kernel_size == [2, 3]
    with pytest.raises(ValueError, match="kernel_size"):
        spconv.SparseMaxPool3d([2, 2])
    with pytest.raises(ValueError, match="stride"):
        SparseMaxPool(3, 3, stride=2, subm=True)
    x = make_sparse([6, 6], 1, 2, n=5)
    with pytest.raises(ValueError, match="spatial_shape"):
        spconv.SparseMaxPool3d(2)(x)
    with pytest.raises(TypeError, match="SparseConvTensor"):
        spconv.SparseMaxPool2d(2)(x.features)
    y = spconv.SparseMaxPool2d(2, indice_key="p")(x)
    with pytest.raises(ValueError, match="indice_key"):
        spconv.SparseMaxPool2d(2, indice_key="p")(y)


def test_record_voxel_count():
    layer = spconv.SparseMaxPool3d(2, record_voxel_count=True)
    x = make_sparse([6, 6, 6], 1, 2, n=40)
    y = layer(x)
    assert int(layer.get_max_num_voxels()) == y.indices.shape[0]
    assert "max_num_voxels_during_training" in layer.state_dict()


def _pool_args(n_in=7, n_out=4, c=3, kvol=2, dtype=torch.float64):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(n_in, c, generator=g, dtype=dtype)
    pair_in = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0], dtype=torch.int32)
    pair_out = torch.tensor([0, 1, 2, 3, 1, 0, 2, 3], dtype=torch.int32)
    offsets = torch.tensor([0, 4, 8], dtype=torch.int64)
    return feats, pair_in, pair_out, offsets, n_out


def test_opcheck_pool_ops():
    ops = torch.ops.spconv
    feats, pin, pout, po, n_out = _pool_args()
    feats.requires_grad_(True)
    torch.library.opcheck(ops.indice_maxpool, (feats, pin, pout, po, n_out))
    torch.library.opcheck(ops.indice_avgpool, (feats, pin, pout, po, n_out))
    out = ops.indice_maxpool(feats.detach(), pin, pout, po, n_out)
    torch.library.opcheck(ops.indice_maxpool_backward, (feats.detach(), out, torch.randn_like(out), pin, pout, po))
    avg, count = ops.indice_avgpool(feats.detach(), pin, pout, po, n_out)
    torch.library.opcheck(ops.indice_avgpool_backward, (torch.randn_like(avg), count, pin, pout, po, feats.shape[0]))


def test_pool_ops_reject_bad_arguments():
    ops = torch.ops.spconv
    feats, pin, pout, po, n_out = _pool_args()
    with pytest.raises(TypeError, match="features"):
        ops.indice_maxpool(feats.int(), pin, pout, po, n_out)
    with pytest.raises(ValueError, match="pair_out"):
        ops.indice_maxpool(feats, pin, pout, po, 2)
    with pytest.raises(ValueError, match="pair_in"):
        ops.indice_avgpool(feats[:3], pin, pout, po, n_out)
    with pytest.raises(ValueError, match="pair_offsets"):
        ops.indice_maxpool(feats, pin, pout, torch.tensor([0, 5, 3]), n_out)
    with pytest.raises(ValueError, match="count"):
        ops.indice_avgpool_backward(torch.randn(n_out, 3, dtype=torch.float64), torch.zeros(n_out, dtype=torch.int32),
                                    pin, pout, po, feats.shape[0])


def test_max_pool_propagates_nan_like_dense():
    """A NaN input makes its windows' outputs NaN and takes their gradient, as F.max_pool3d does."""
    x = make_sparse(DENSE_SHAPES[3], 1, 2, n=40, seed=21, positive=True)
    feats = x.features.clone()
    covered = ((x.indices[:, 1:] < torch.tensor([6, 6, 4])).all(1)).nonzero()[0, 0]  # a site some window reads
    feats[covered, 1] = float("nan")
    feats.requires_grad_(True)
    y = _MAX_LAYER[3](2, 2, 0, 1)(with_features(x, feats))
    yd = y.dense()
    g = torch.rand(yd.shape, generator=torch.Generator().manual_seed(3), dtype=yd.dtype)
    (yd * g).nansum().backward()
    xd = with_features(x, feats.detach()).dense().clone().requires_grad_(True)
    ref = _MAXPOOL[3](xd, 2, 2, 0, 1)
    (ref * g).nansum().backward()
    assert torch.equal(torch.isnan(yd), torch.isnan(ref)) and torch.isnan(yd).sum() == 1
    torch.testing.assert_close(yd.nan_to_num(), ref.detach().nan_to_num(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(feats.grad, gather_sites(xd.grad, x.indices), atol=1e-4, rtol=1e-4)
