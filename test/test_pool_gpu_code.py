"""Sparse pooling's GPU code (csrc/hip/pool.cu and its glue) wherever it runs (``gpu_place``: the HIP CPU build,
and a GPU when there is one): the four pool ops against the CPU implementation on the same kernel maps (forward,
count, dinput; FP32/FP16/BF16/FP64, 1D-4D, ties, NaN, mixed dtypes, non-contiguous input), the layers' table route,
the pooling layers against the CPU layers and against dense torch pooling, empty inputs and outputs, argument
checks, and bitwise run-to-run determinism."""
import pytest
import torch
import torch.nn.functional as F

import spconv.pytorch as spconv
from spconv.pytorch import ops as sp_ops
from support.pool_cases import DENSE_CASES, DENSE_SHAPES, case_id, dense_window_sum
from support.surface import gather_sites, make_sparse, occupancy, sorted_rows, with_features
from spconv.pytorch.pool import SparseAvgPool

ops = torch.ops.spconv  # the CPU route: the reference

_SHAPE = {1: [40], 2: [12, 11], 3: [9, 8, 7], 4: [5, 6, 4, 5]}
_MAX_LAYER = {1: spconv.SparseMaxPool1d, 2: spconv.SparseMaxPool2d, 3: spconv.SparseMaxPool3d,
              4: spconv.SparseMaxPool4d}
_AVG_LAYER = {1: spconv.SparseAvgPool1d, 2: spconv.SparseAvgPool2d, 3: spconv.SparseAvgPool3d}
_MAXPOOL = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}
DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64]

# Avg pooling sums in the CPU's order and rounds the same way, so GPU and CPU should agree bit for bit; the
# tolerance only absorbs a host compiler that fuses the CPU's multiply-add (e.g. aarch64 with FMA contraction).
_AVG_TOL = {torch.float32: dict(rtol=1e-6, atol=1e-6), torch.float64: dict(rtol=1e-12, atol=1e-12),
            torch.float16: dict(rtol=1e-3, atol=1e-5), torch.bfloat16: dict(rtol=8e-3, atol=1e-5)}


def _map(nd, n, seed, ksize=3, stride=2, padding=1, dilation=1, batch=2):
    """A regular pooling kernel map built on the CPU, and the CPU sparse tensor it was built from."""
    shape = _SHAPE[nd]
    x = make_sparse(shape, batch, 1, n=n, seed=seed)
    k, s, p, d = ([v] * nd for v in (ksize, stride, padding, dilation))
    out_shape = sp_ops.get_conv_output_size(shape, k, s, p, d)
    _, maps = sp_ops.build_kernel_map(x.indices, batch, shape, out_shape, k, s, p, d, False, False)
    return x, maps


def _features(n, c, seed, dtype, ties=False):
    g = torch.Generator().manual_seed(seed)
    f = torch.randn(n, c, generator=g, dtype=torch.float64)
    if ties:  # few distinct values: equal maxima in most windows, so the "first offset wins" rule decides
        f = torch.round(f * 2) / 2
    return f.to(dtype)


def _upstream(shape, dtype, seed):
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64).to(dtype)


def _pairs(maps, dev):
    return maps.pair_in.to(dev), maps.pair_out.to(dev), maps.pair_offsets.to(dev)


def _max_both(place, feats, maps, seed=1, dy_dtype=None):
    """indice_maxpool + backward on the CPU and by the GPU code with the same map: [(y, dx) cpu, (y, dx) gpu]."""
    out = []
    for lib, dev in ((ops, "cpu"), (place.ops, place.device)):
        pin, pout, po = _pairs(maps, dev)
        x = feats.to(dev)
        y = lib.indice_maxpool(x, pin, pout, po, maps.num_out)
        dy = _upstream(y.shape, dy_dtype or y.dtype, seed).to(dev)
        dx = lib.indice_maxpool_backward(x, y, dy, pin, pout, po)
        out.append((y.cpu(), dx.cpu()))
    return out


def _avg_both(place, feats, maps, seed=1):
    """indice_avgpool + backward on the CPU and by the GPU code: [(y, count, dx) cpu, (y, count, dx) gpu]."""
    out = []
    for lib, dev in ((ops, "cpu"), (place.ops, place.device)):
        pin, pout, po = _pairs(maps, dev)
        x = feats.to(dev)
        y, count = lib.indice_avgpool(x, pin, pout, po, maps.num_out)
        dy = _upstream(y.shape, y.dtype, seed).to(dev)
        dx = lib.indice_avgpool_backward(dy, count, pin, pout, po, x.shape[0])
        out.append((y.cpu(), count.cpu(), dx.cpu()))
    return out


def _assert_avg_equal(cpu, gpu, dtype):
    (y0, c0, dx0), (y1, c1, dx1) = cpu, gpu
    assert y1.dtype == dtype and dx1.dtype == dtype and c1.dtype == torch.int32
    assert torch.equal(c0, c1)
    torch.testing.assert_close(y1, y0, **_AVG_TOL[dtype])
    torch.testing.assert_close(dx1, dx0, **_AVG_TOL[dtype])


# ---- ops against the CPU implementation on the same map ----
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("ties", [False, True], ids=["distinct", "ties"])
def test_maxpool_ops_match_cpu_bitwise(gpu_place, nd, dtype, ties):
    x, maps = _map(nd, n=150, seed=nd)
    feats = _features(x.indices.shape[0], 7, seed=nd + 10, dtype=dtype, ties=ties)
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert y1.dtype == dtype and dx1.dtype == dtype
    # max only selects and the gradient is summed in the CPU's order: identical bits
    assert torch.equal(y1, y0)
    assert torch.equal(dx1, dx0)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
def test_avgpool_ops_match_cpu(gpu_place, nd, dtype):
    x, maps = _map(nd, n=150, seed=nd + 20)
    feats = _features(x.indices.shape[0], 7, seed=nd + 30, dtype=dtype)
    cpu, gpu = _avg_both(gpu_place, feats, maps)
    _assert_avg_equal(cpu, gpu, dtype)


@pytest.mark.parametrize("ksize,stride,padding,dilation", [(2, 2, 0, 1), (3, 1, 1, 1), (3, 2, 1, 2), (5, 3, 2, 1)])
def test_pool_ops_geometries(gpu_place, ksize, stride, padding, dilation):
    x, maps = _map(3, n=200, seed=ksize * 7 + stride, ksize=ksize, stride=stride, padding=padding,
                   dilation=dilation)
    feats = _features(x.indices.shape[0], 5, seed=3, dtype=torch.float32, ties=True)
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    cpu, gpu = _avg_both(gpu_place, feats, maps)
    _assert_avg_equal(cpu, gpu, torch.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_pool_ops_on_a_submanifold_map(gpu_place, dtype):
    """A submanifold map (every site its own output, 3x3x3 windows): max and avg give the CPU's bits."""
    shape = _SHAPE[3]
    x = make_sparse(shape, 2, 1, n=150, seed=50)
    _, maps = sp_ops.build_kernel_map(x.indices, 2, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    feats = _features(x.indices.shape[0], 64, seed=51, dtype=dtype, ties=True)
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    (y0, c0, dx0), (y1, c1, dx1) = _avg_both(gpu_place, feats, maps)
    assert torch.equal(c1, c0) and torch.equal(y1, y0) and torch.equal(dx1, dx0)


@pytest.mark.parametrize("channels", [1, 3, 64, 257])
def test_pool_ops_channel_counts(gpu_place, channels):
    x, maps = _map(3, n=120, seed=channels)
    feats = _features(x.indices.shape[0], channels, seed=channels, dtype=torch.float32)
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    _assert_avg_equal(*_avg_both(gpu_place, feats, maps), torch.float32)


def test_maxpool_negative_inputs_clamp_at_zero_like_cpu(gpu_place):
    """All-negative windows give 0 and send no gradient anywhere (spconv's semantics), as on the CPU."""
    x, maps = _map(3, n=150, seed=5)
    feats = -_features(x.indices.shape[0], 4, seed=5, dtype=torch.float32).abs() - 0.1
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert torch.equal(y1, y0) and torch.equal(y1, torch.zeros_like(y1))
    assert torch.equal(dx1, dx0) and torch.equal(dx1, torch.zeros_like(dx1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_maxpool_nan_matches_cpu(gpu_place, dtype):
    """A NaN input makes its outputs NaN and takes their gradient (the first NaN in offset order), as on the CPU."""
    x, maps = _map(3, n=150, seed=8)
    feats = _features(x.indices.shape[0], 4, seed=8, dtype=dtype)
    feats[::7, 1] = float("nan")
    feats[3, :] = float("nan")
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert torch.isnan(y1).any()
    assert torch.equal(torch.isnan(y1), torch.isnan(y0))
    assert torch.equal(y1.nan_to_num(), y0.nan_to_num())
    assert torch.equal(torch.isnan(dx1), torch.isnan(dx0))
    assert torch.equal(dx1.nan_to_num(), dx0.nan_to_num())


def test_avgpool_nan_and_inf_match_cpu(gpu_place):
    x, maps = _map(2, n=80, seed=9)
    feats = _features(x.indices.shape[0], 3, seed=9, dtype=torch.float32)
    feats[::5, 0] = float("nan")
    feats[::6, 2] = float("inf")
    (y0, c0, dx0), (y1, c1, dx1) = _avg_both(gpu_place, feats, maps)
    assert torch.equal(c1, c0)
    torch.testing.assert_close(y1, y0, equal_nan=True, **_AVG_TOL[torch.float32])
    torch.testing.assert_close(dx1, dx0, **_AVG_TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32], ids=str)
def test_maxpool_backward_mixed_dtypes_match_cpu(gpu_place, dtype):
    """out_grad in another dtype than the features: computed in the compute type, as the CPU glue does."""
    x, maps = _map(3, n=120, seed=12)
    feats = _features(x.indices.shape[0], 4, seed=12, dtype=dtype, ties=True)
    other = torch.float64 if dtype == torch.float32 else torch.float32
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps, dy_dtype=other)
    assert dx1.dtype == dtype
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)


def test_pool_ops_non_contiguous_features(gpu_place):
    x, maps = _map(3, n=120, seed=13)
    wide = _features(x.indices.shape[0], 10, seed=13, dtype=torch.float32)
    feats = wide[:, ::2]
    assert not feats.is_contiguous()
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    (z0, _), (z1, _) = _max_both(gpu_place, feats.contiguous(), maps)
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0) and torch.equal(y1, z1)
    _assert_avg_equal(*_avg_both(gpu_place, feats, maps), torch.float32)


# ---- the layers' route: neighbour tables, one launch each way ----
def _table_route_both(place, feats, x, maximum):
    """(y, dx) through spconv.pytorch.ops.indice_*pool_native by the GPU code (map built there, with its table) and
    the CPU pair ops on that map."""
    shape = x.spatial_shape
    nd = len(shape)
    k, s, p, d = [3] * nd, [2] * nd, [1] * nd, [1] * nd
    out_shape = sp_ops.get_conv_output_size(shape, k, s, p, d)
    with place.active():
        out_gpu, gmaps = sp_ops.build_kernel_map(place.to(x.indices), 2, shape, out_shape, k, s, p, d, False, False)
        xs = place.to(feats).detach().requires_grad_(True)
        fn = sp_ops.indice_maxpool_native if maximum else (lambda *a: sp_ops.indice_avgpool_native(*a)[0])
        y = fn(xs, gmaps, out_gpu.shape[0])
        dy = place.to(_upstream(y.shape, y.dtype, 3))
        y.backward(dy)
    assert "pool_out_table" in gmaps.cache  # the table route ran
    pin, pout, po = (t.cpu() for t in (gmaps.pair_in, gmaps.pair_out, gmaps.pair_offsets))
    f = feats.cpu()
    if maximum:
        y0 = ops.indice_maxpool(f, pin, pout, po, out_gpu.shape[0])
        dx0 = ops.indice_maxpool_backward(f, y0, dy.cpu(), pin, pout, po)
    else:
        y0, c0 = ops.indice_avgpool(f, pin, pout, po, out_gpu.shape[0])
        dx0 = ops.indice_avgpool_backward(dy.cpu(), c0, pin, pout, po, f.shape[0])
    return (y0, dx0), (y.detach().cpu(), xs.grad.cpu())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
def test_table_route_matches_cpu_bitwise(gpu_place, nd, dtype):
    x, _ = _map(nd, n=150, seed=nd + 40)
    feats = _features(x.indices.shape[0], 7, seed=nd + 41, dtype=dtype, ties=True)
    feats[1::4] = -feats[1::4].abs() - 0.25  # clamped windows
    (y0, dx0), (y1, dx1) = _table_route_both(gpu_place, feats, x, True)
    assert y1.dtype == dx1.dtype == dtype
    assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    (a0, da0), (a1, da1) = _table_route_both(gpu_place, feats, x, False)
    torch.testing.assert_close(a1, a0, **_AVG_TOL[dtype])
    torch.testing.assert_close(da1, da0, **_AVG_TOL[dtype])


# ---- empty inputs, outputs and channels ----
def test_pool_ops_without_pairs(gpu_place):
    """No pairs: max outputs 0, avg outputs 0 with count 0, and the gradients are zero."""
    lib, dev = gpu_place.ops, gpu_place.device
    feats = _features(6, 3, seed=0, dtype=torch.float32).to(dev)
    pin = torch.zeros(0, dtype=torch.int32, device=dev)
    pout = torch.zeros(0, dtype=torch.int32, device=dev)
    po = torch.zeros(28, dtype=torch.int64, device=dev)
    y = lib.indice_maxpool(feats, pin, pout, po, 4)
    assert y.shape == (4, 3) and torch.equal(y.cpu(), torch.zeros(4, 3))
    dx = lib.indice_maxpool_backward(feats, y, torch.ones_like(y), pin, pout, po)
    assert torch.equal(dx.cpu(), torch.zeros(6, 3))
    a, count = lib.indice_avgpool(feats, pin, pout, po, 4)
    assert torch.equal(a.cpu(), torch.zeros(4, 3)) and torch.equal(count.cpu(), torch.zeros(4, dtype=torch.int32))
    assert count.device.type == dev.type
    dx = lib.indice_avgpool_backward(torch.ones_like(a), count, pin, pout, po, 6)
    assert torch.equal(dx.cpu(), torch.zeros(6, 3))


def test_pool_ops_empty_input_and_output(gpu_place):
    lib, dev = gpu_place.ops, gpu_place.device
    feats = torch.zeros(0, 5, device=dev)
    pin = torch.zeros(0, dtype=torch.int32, device=dev)
    po = torch.zeros(9, dtype=torch.int64, device=dev)
    y = lib.indice_maxpool(feats, pin, pin, po, 0)
    assert y.shape == (0, 5)
    assert lib.indice_maxpool_backward(feats, y, y, pin, pin, po).shape == (0, 5)
    a, count = lib.indice_avgpool(feats, pin, pin, po, 0)
    assert a.shape == (0, 5) and count.shape == (0,)
    assert lib.indice_avgpool_backward(a, count, pin, pin, po, 0).shape == (0, 5)


def test_pool_ops_zero_channels_still_count(gpu_place):
    x, maps = _map(3, n=60, seed=14)
    feats = torch.zeros(x.indices.shape[0], 0)
    (y0, dx0), (y1, dx1) = _max_both(gpu_place, feats, maps)
    assert y1.shape == y0.shape == (maps.num_out, 0) and dx1.shape == dx0.shape
    (_, c0, _), (a1, c1, dx1) = _avg_both(gpu_place, feats, maps)
    assert torch.equal(c1, c0) and a1.shape == (maps.num_out, 0) and dx1.shape == (x.indices.shape[0], 0)


@pytest.mark.parametrize("layer", [spconv.SparseMaxPool3d(2), spconv.SparseAvgPool3d(3, 2, 1)], ids=["max", "avg"])
def test_empty_input_flows_forward_and_backward(gpu_place, layer):
    dev = gpu_place.device
    with gpu_place.active():
        f = torch.zeros(0, 4, device=dev, requires_grad=True)
        x = spconv.SparseConvTensor(f, torch.zeros(0, 4, dtype=torch.int32, device=dev), [6, 6, 6], 2)
        y = layer(x)
        assert y.features.shape == (0, 4) and y.features.device.type == dev.type
        y.features.sum().backward()
        assert f.grad.shape == (0, 4)
        assert y.dense().shape[0] == 2


# ---- layers by the GPU code: against the CPU layers and dense torch pooling ----
def _coordinate_weights(indices, channels):
    """An upstream gradient that depends only on the output coordinate, so row order does not matter."""
    w = torch.tensor([0.7, 1.3, 0.9, 1.1, 0.5], dtype=torch.float64)[:indices.shape[1]]
    return torch.sin(indices.double() @ w[:, None] + torch.arange(channels, dtype=torch.float64) * 0.61)


def _run_layer(layer, x, dev, dtype):
    f = x.features.to(device=dev, dtype=dtype).detach().requires_grad_(True)  # a leaf even where .to() is a no-op
    xs = spconv.SparseConvTensor(f, x.indices.to(dev), x.spatial_shape, x.batch_size)
    y = layer(xs)
    assert y.features.dtype == dtype and y.features.device.type == torch.device(dev).type
    g = _coordinate_weights(y.indices.cpu(), y.features.shape[1]).to(device=dev, dtype=dtype)
    (y.features * g).sum().backward()
    idx, feats = sorted_rows(y.indices.cpu(), y.features.detach().cpu())
    return idx, feats, f.grad.cpu()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["max", "avg"])
def test_layer_by_gpu_code_matches_cpu(gpu_place, kind, nd, dtype):
    """The GPU kernel map may order its outputs differently; per coordinate the results are the CPU's."""
    if kind == "avg" and nd == 4:
        layer = SparseAvgPool(4, 3, 2, 1)  # no SparseAvgPool4d class, the base takes ndim
    else:
        layer = (_MAX_LAYER if kind == "max" else _AVG_LAYER)[nd](3, 2, 1)
    x = make_sparse(_SHAPE[nd], 2, 6, n=200, seed=40 + nd)
    i0, y0, dx0 = _run_layer(layer, x, "cpu", dtype)
    with gpu_place.active():
        i1, y1, dx1 = _run_layer(layer, x, gpu_place.device, dtype)
    assert torch.equal(i1, i0)
    if kind == "max":
        assert torch.equal(y1, y0) and torch.equal(dx1, dx0)
    else:
        torch.testing.assert_close(y1, y0, **_AVG_TOL[dtype])
        torch.testing.assert_close(dx1, dx0, **_AVG_TOL[dtype])


def _dense_grads(place, layer, x, seed=1):
    """The layer by the GPU code, densified, and its dinput for a dense upstream gradient (all on the CPU)."""
    with place.active():
        feats = place.to(x.features).clone().requires_grad_(True)
        xs = spconv.SparseConvTensor(feats, place.to(x.indices), x.spatial_shape, x.batch_size)
        yd = layer(xs).dense()
        g = torch.randn(yd.shape, generator=torch.Generator().manual_seed(seed), dtype=yd.dtype)
        (yd * place.to(g)).sum().backward()
    return yd.detach().cpu(), feats.grad.cpu(), g


@pytest.mark.parametrize("case", DENSE_CASES[::2], ids=case_id)
def test_max_pool_by_gpu_code_matches_dense(gpu_place, case):
    """Positive features: the sparse max pool densified equals F.max_pool on the densified input."""
    nd, k, s, p, d = case
    x = make_sparse(DENSE_SHAPES[nd], 2, 3, n=40, seed=sum(case), positive=True)
    yd, dx, g = _dense_grads(gpu_place, _MAX_LAYER[nd](k, s, p, d), x)
    xd = x.dense().clone().requires_grad_(True)
    ref = _MAXPOOL[nd](xd, k, s, p, d)
    (ref * g).sum().backward()
    torch.testing.assert_close(yd, ref.detach(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("case", DENSE_CASES[1::2], ids=case_id)
def test_avg_pool_by_gpu_code_matches_dense_mean_of_active(gpu_place, case):
    nd, k, s, p, d = case
    x = make_sparse(DENSE_SHAPES[nd], 2, 3, n=40, seed=sum(case) + 3)
    yd, dx, g = _dense_grads(gpu_place, _AVG_LAYER[nd](k, s, p, d), x)
    xd = x.dense().clone().requires_grad_(True)
    count = dense_window_sum(occupancy(x), k, s, p, d)
    ref = dense_window_sum(xd, k, s, p, d) / count.clamp(min=1)
    (ref * g * (count > 0)).sum().backward()
    torch.testing.assert_close(yd, ref.detach() * (count > 0), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("nd", [2, 3])
def test_max_pool_ties_by_gpu_code_follow_torch_raster_order(gpu_place, nd):
    x = make_sparse(DENSE_SHAPES[nd], 1, 2, n=60, seed=11)
    x = with_features(x, torch.ones_like(x.features))
    yd, dx, g = _dense_grads(gpu_place, _MAX_LAYER[nd](3, 2, 1, 1), x)
    xd = x.dense().clone().requires_grad_(True)
    (_MAXPOOL[nd](xd, 3, 2, 1, 1) * g).sum().backward()
    torch.testing.assert_close(dx, gather_sites(xd.grad, x.indices), atol=1e-6, rtol=1e-6)


def test_max_pool_4d_by_gpu_code_matches_brute_force(gpu_place):
    x = make_sparse([5, 4, 4, 3], 1, 2, n=50, seed=5)
    with gpu_place.active():
        xs = spconv.SparseConvTensor(gpu_place.to(x.features), gpu_place.to(x.indices), x.spatial_shape, 1)
        y = spconv.SparseMaxPool4d(2, 2)(xs)
    xi, yi, yf = x.indices.long(), y.indices.long().cpu(), y.features.cpu()
    for r in range(yi.shape[0]):
        inside = (xi[:, 0] == yi[r, 0]) & ((xi[:, 1:] // 2) == yi[r, 1:]).all(1)
        torch.testing.assert_close(yf[r], x.features[inside].max(0).values.clamp(min=0))


def test_max_pool_by_gpu_code_propagates_nan_like_dense(gpu_place):
    x = make_sparse(DENSE_SHAPES[3], 1, 2, n=40, seed=21, positive=True)
    feats = x.features.clone()
    covered = ((x.indices[:, 1:] < torch.tensor([6, 6, 4])).all(1)).nonzero()[0, 0]
    feats[covered, 1] = float("nan")
    with gpu_place.active():
        f = feats.to(gpu_place.device, copy=True).requires_grad_(True)
        y = spconv.SparseMaxPool3d(2, 2)(spconv.SparseConvTensor(f, gpu_place.to(x.indices), x.spatial_shape, 1))
        yd = y.dense()
        g = torch.rand(yd.shape, generator=torch.Generator().manual_seed(3), dtype=yd.dtype)
        (yd * gpu_place.to(g)).nansum().backward()
    xd = with_features(x, feats).dense().clone().requires_grad_(True)
    ref = F.max_pool3d(xd, 2, 2)
    (ref * g).nansum().backward()
    yd = yd.detach().cpu()
    assert torch.equal(torch.isnan(yd), torch.isnan(ref)) and torch.isnan(yd).sum() == 1
    torch.testing.assert_close(yd.nan_to_num(), ref.detach().nan_to_num(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(f.grad.cpu(), gather_sites(xd.grad, x.indices), atol=1e-5, rtol=1e-5)


# ---- determinism ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=str)
def test_pool_bitwise_deterministic(gpu_place, dtype):
    """Many pairs per output and per input: repeated runs agree bit for bit (no floating-point atomics)."""
    lib, dev = gpu_place.ops, gpu_place.device
    n = 30000 if dev.type == "cuda" else 3000  # (every GPU thread a fiber on the CPU)
    x2 = make_sparse([40, 40, 40], 2, 1, n=n, seed=17)
    with gpu_place.active():
        _, maps = sp_ops.build_kernel_map(x2.indices.to(dev), 2, [40, 40, 40], [20, 20, 20], [3] * 3, [2] * 3,
                                          [1] * 3, [1] * 3, False, False)
    feats = _features(x2.indices.shape[0], 48, seed=17, dtype=dtype, ties=True).to(dev)
    pin, pout, po = _pairs(maps, dev)
    runs = []
    for _ in range(3):
        y = lib.indice_maxpool(feats, pin, pout, po, maps.num_out)
        dy = _upstream(y.shape, dtype, 2).to(dev)
        dxm = lib.indice_maxpool_backward(feats, y, dy, pin, pout, po)
        a, count = lib.indice_avgpool(feats, pin, pout, po, maps.num_out)
        dxa = lib.indice_avgpool_backward(dy, count, pin, pout, po, feats.shape[0])
        runs.append([t.cpu() for t in (y, dxm, a, count, dxa)])
    for other in runs[1:]:
        for r0, r in zip(runs[0], other):
            assert torch.equal(r0, r)


# ---- argument checks: the CPU glue's messages, and no device-side fault ----
def _bad_args(dev):
    g = torch.Generator().manual_seed(0)
    feats = torch.randn(7, 3, generator=g).to(dev)
    pin = torch.tensor([0, 1, 2, 3, 4, 5, 6, 0], dtype=torch.int32, device=dev)
    pout = torch.tensor([0, 1, 2, 3, 1, 0, 2, 3], dtype=torch.int32, device=dev)
    po = torch.tensor([0, 4, 8], dtype=torch.int64, device=dev)
    return feats, pin, pout, po, 4


def test_pool_ops_reject_bad_arguments(gpu_place):
    lib, dev = gpu_place.ops, gpu_place.device
    feats, pin, pout, po, n_out = _bad_args(dev)
    with pytest.raises(TypeError, match="features"):
        lib.indice_maxpool(feats.int(), pin, pout, po, n_out)
    with pytest.raises(ValueError, match="pair_out"):
        lib.indice_maxpool(feats, pin, pout, po, 2)
    with pytest.raises(ValueError, match="pair_in"):
        lib.indice_avgpool(feats[:3], pin, pout, po, n_out)
    with pytest.raises(ValueError, match="pair_in"):
        lib.indice_maxpool(feats, pin - 1, pout, po, n_out)
    with pytest.raises(ValueError, match="pair_offsets"):
        lib.indice_maxpool(feats, pin, pout, torch.tensor([0, 5, 3], device=dev), n_out)
    with pytest.raises(ValueError, match="pair_offsets"):
        lib.indice_maxpool(feats, pin, pout, torch.tensor([0, 6, 4, 8], device=dev), n_out)
    with pytest.raises(ValueError, match="count"):
        lib.indice_avgpool_backward(torch.randn(n_out, 3, device=dev), torch.zeros(n_out, dtype=torch.int32,
                                                                                 device=dev), pin, pout, po, 7)
    with pytest.raises(ValueError, match="pair_out"):  # out of range rows must not reach index_select
        lib.indice_avgpool_backward(torch.randn(2, 3, device=dev), torch.ones(2, dtype=torch.int32, device=dev),
                                    pin, pout, po, 7)
    y = lib.indice_maxpool(feats, pin, pout, po, n_out)
    if dev.type == "cuda":  # tensors on two devices
        with pytest.raises(ValueError, match="device"):
            lib.indice_maxpool(feats, pin.cpu(), pout.cpu(), po.cpu(), n_out)
        with pytest.raises(ValueError, match="count"):
            lib.indice_avgpool_backward(torch.randn(n_out, 3, device=dev), torch.ones(n_out, dtype=torch.int32), pin,
                                        pout, po, 7)
        with pytest.raises(ValueError, match="out_grad"):
            lib.indice_maxpool_backward(feats, y, y.cpu(), pin, pout, po)
    # nothing above faulted: the device still computes the CPU's result
    gpu_place.synchronize()
    assert torch.equal(y.cpu(), ops.indice_maxpool(feats.cpu(), pin.cpu(), pout.cpu(), po.cpu(), n_out))


def test_opcheck_pool_ops(gpu_place):
    lib = gpu_place.ops
    feats, pin, pout, po, n_out = _bad_args(gpu_place.device)
    feats = feats.double()
    torch.library.opcheck(lib.indice_maxpool, (feats.clone().requires_grad_(True), pin, pout, po, n_out))
    torch.library.opcheck(lib.indice_avgpool, (feats.clone().requires_grad_(True), pin, pout, po, n_out))
    out = lib.indice_maxpool(feats, pin, pout, po, n_out)
    torch.library.opcheck(lib.indice_maxpool_backward, (feats, out, torch.randn_like(out), pin, pout, po))
    avg, count = lib.indice_avgpool(feats, pin, pout, po, n_out)
    torch.library.opcheck(lib.indice_avgpool_backward, (torch.randn_like(avg), count, pin, pout, po, feats.shape[0]))
