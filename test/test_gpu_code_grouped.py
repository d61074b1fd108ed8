"""Grouped convolution through the GPU code wherever it runs (``gpu_place``: the HIP CPU build, and a GPU when
there is one): the grouped kernels and glue (csrc/hip/grouped_conv.cu, csrc/ops/gpu/grouped_gpu.cpp) op by op
against the native CPU route, and grouped layers through both GPU routes (fused: the table kernels; native:
gather, per-group GEMM, scatter) against the CPU route. FP32/FP64 to 1e-5 relative, FP16/BF16 against FP64. The
HIP CPU build takes small sizes (every GPU thread is a fiber there); a GPU's network is wider, in every dtype,
and run twice (bitwise the same)."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import constants
from spconv.pytorch import _grouped
from support.places import per_place
from support.reference import random_sparse

cpu = torch.ops.spconv


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return (torch.linalg.norm(a - b) / max(torch.linalg.norm(b).item(), 1e-30)).item()


def _case(kind, cin, cout, groups, dtype=torch.float32, seed=0):
    """(features, filters, maps) of one small layer on the CPU; maps from the CPU route."""
    torch.manual_seed(seed)
    x = random_sparse(3, [6, 7, 5], 2, cin, density=0.3, seed=seed, dtype=dtype)
    if kind == "subm":
        layer = spconv.SubMConv3d(cin, cout, 3, groups=groups, indice_key="k")
    else:
        layer = spconv.SparseConv3d(cin, cout, 3, 2, 1, groups=groups, indice_key="k")
    y = layer.to(dtype)(x)
    return x.features, _grouped.weight_to_grouped_filters(layer.weight.detach(), groups), y.indice_dict["k"].maps


def _pairs(place, maps):
    return place.to(maps.pair_in), place.to(maps.pair_out), place.to(maps.pair_offsets)


SHAPES = [("subm", 6, 6, 6), ("subm", 8, 12, 4), ("conv", 9, 6, 3), ("subm", 16, 16, 2), ("conv", 32, 32, 32)]


@pytest.mark.parametrize("kind,cin,cout,groups", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ops_match_cpu(gpu_place, kind, cin, cout, groups, dtype):
    feats, filters, maps = _case(kind, cin, cout, groups, dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout, dtype=dtype)
    ops, on = gpu_place.ops, gpu_place.to
    want = cpu.grouped_conv(feats, filters, nbr, nbr_t)
    got = ops.grouped_conv(on(feats), on(filters), on(nbr), on(nbr_t))
    assert rel(got, want) < 1e-5
    wdx, wdw = cpu.grouped_conv_backward(feats, filters, dy, nbr_t)
    gdx, gdw = ops.grouped_conv_backward(on(feats), on(filters), on(dy), on(nbr_t))
    assert rel(gdx, wdx) < 1e-5 and rel(gdw, wdw) < 1e-5
    pairs = _pairs(gpu_place, maps)
    got_p = ops.indice_conv_grouped(on(feats), on(filters), *pairs, maps.num_out)
    assert rel(got_p, want) < 1e-5
    pdx, pdw = ops.indice_conv_grouped_backward(on(feats), on(filters), on(dy), *pairs)
    assert rel(pdx, wdx) < 1e-5 and rel(pdw, wdw) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("kind,cin,cout,groups", SHAPES)
def test_ops_low_precision(gpu_place, dtype, tol, kind, cin, cout, groups):
    feats, filters, maps = _case(kind, cin, cout, groups, torch.float32)
    feats, filters = feats.to(dtype), filters.to(dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout).to(dtype)
    ref = cpu.grouped_conv(feats.double(), filters.double(), nbr, nbr_t)
    rdx, rdw = cpu.grouped_conv_backward(feats.double(), filters.double(), dy.double(), nbr_t)
    ops, on = gpu_place.ops, gpu_place.to
    for name in ("table", "pairs"):
        if name == "table":
            y = ops.grouped_conv(on(feats), on(filters), on(nbr), on(nbr_t))
            dx, dw = ops.grouped_conv_backward(on(feats), on(filters), on(dy), on(nbr_t))
        else:
            pairs = _pairs(gpu_place, maps)
            y = ops.indice_conv_grouped(on(feats), on(filters), *pairs, maps.num_out)
            dx, dw = ops.indice_conv_grouped_backward(on(feats), on(filters), on(dy), *pairs)
        assert y.dtype == dx.dtype == dw.dtype == dtype
        assert rel(y, ref) < tol and rel(dx, rdx) < tol and rel(dw, rdw) < tol, name


def _misaligned(t):
    """A copy of t (on its device) whose data starts one element past an allocation's start: the kernels' vector
    loads need their pointers aligned to the vector, so they fall back to one element at a time."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype, device=t.device)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


# Grouped (8 output channels per group: 2-8 columns a thread) and depthwise (16 groups a thread in FP16).
@pytest.mark.parametrize("kind,cin,cout,groups", [("subm", 16, 16, 2), ("subm", 32, 32, 32), ("conv", 16, 32, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_vector_width_keeps_the_bits(gpu_place, kind, cin, cout, groups, dtype):
    """The kernels move V channels per thread where the pointers allow: with every pointer one element off its
    alignment they run with V = 1, and the results are the same bits (V changes the schedule, not the sums)."""
    feats, filters, maps = _case(kind, cin, cout, groups, torch.float32)
    feats, filters = feats.to(dtype), filters.to(dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout).to(dtype)
    ops, on = gpu_place.ops, gpu_place.to
    f, w, d, n, nt = on(feats), on(filters), on(dy), on(nbr), on(nbr_t)
    y = ops.grouped_conv(f, w, n, nt)
    dx, dw = ops.grouped_conv_backward(f, w, d, nt)
    mf, mw, mdy = _misaligned(f), _misaligned(w), _misaligned(d)
    assert all(t.data_ptr() % (2 * t.element_size()) != 0 for t in (mf, mw, mdy))  # no vector of 2 fits
    y1 = ops.grouped_conv(mf, mw, n, nt)
    dx1, dw1 = ops.grouped_conv_backward(mf, mw, mdy, nt)
    assert torch.equal(y1, y) and torch.equal(dx1, dx) and torch.equal(dw1, dw)
    ref = cpu.grouped_conv(feats.double(), filters.double(), nbr, nbr_t)
    assert rel(y, ref) < (1e-5 if dtype != torch.float16 else 2e-3)


def test_bad_table_raises(gpu_place):
    feats, filters, maps = _case("subm", 8, 12, 4)
    nbr, nbr_t = _grouped.tables(maps, True)
    bad = nbr.clone()
    bad[3, 1] = feats.shape[0] + 7
    ops, on = gpu_place.ops, gpu_place.to
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        ops.grouped_conv(on(feats), on(filters), on(bad), on(nbr_t))
    with pytest.raises(ValueError, match="filters expect groups"):
        ops.grouped_conv(on(feats), on(filters[:, :2]), on(nbr), on(nbr_t))


def test_empty(gpu_place):
    on = gpu_place.to
    feats = on(torch.zeros(0, 8))
    filters = on(torch.randn(27, 4, 2, 3))
    nbr = on(torch.zeros(0, 27, dtype=torch.int32))
    assert gpu_place.ops.grouped_conv(feats, filters, nbr, nbr).shape == (0, 12)
    dx, dw = gpu_place.ops.grouped_conv_backward(feats, filters, on(torch.zeros(0, 12)), nbr)
    assert dx.shape == (0, 8) and torch.equal(dw.cpu(), torch.zeros_like(filters).cpu())


def _run(net, x, device, dtype):
    """Forward, then backward of a fixed loss: [output features, dinput, the parameters' gradients]."""
    net = net.to(device, dtype)
    net.zero_grad()
    feats = x.features.to(device, dtype).detach().requires_grad_(True)  # a leaf, also where .to() is a no-op
    out = net(spconv.SparseConvTensor(feats, x.indices.to(device), x.spatial_shape, x.batch_size))
    g = torch.sin(torch.arange(out.features.numel(), dtype=torch.float64)).view_as(out.features)
    (out.features * g.to(device, dtype)).sum().backward()
    return [out.features.detach(), feats.grad] + [p.grad.clone() for p in net.parameters()]


def _small_net(seed=0):
    """Depthwise, groups 2/4, 1x1 and inverse layers at the HIP CPU build's sizes."""
    torch.manual_seed(seed)
    return spconv.SparseSequential(
        spconv.SubMConv3d(8, 8, 3, groups=8, indice_key="a"), torch.nn.ReLU(),
        spconv.SparseConv3d(8, 16, 3, 2, 1, groups=2, indice_key="d"),
        spconv.SubMConv3d(16, 16, 3, groups=4, indice_key="b"),
        spconv.SubMConv3d(16, 16, 1, groups=4),
        spconv.SparseInverseConv3d(16, 8, 3, indice_key="d", groups=2))


def _gpu_net(seed=0):
    """The same layer kinds, wider, for a GPU."""
    torch.manual_seed(seed)
    return spconv.SparseSequential(
        spconv.SubMConv3d(32, 32, 3, groups=32, indice_key="a"), torch.nn.ReLU(),
        spconv.SubMConv3d(32, 64, 3, groups=4, indice_key="a"),
        spconv.SparseConv3d(64, 64, 3, 2, 1, groups=8, indice_key="d"),
        spconv.SubMConv3d(64, 64, 1, groups=2),
        spconv.SparseInverseConv3d(64, 32, 3, indice_key="d", groups=32))


# place -> (network, input): the input as random_sparse's arguments
NETWORKS = {"hip_cpu": (_small_net, dict(ndim=3, shape=[8, 9, 7], batch=2, channels=8, density=0.25, seed=3)),
            "cuda": (_gpu_net, dict(ndim=3, shape=[24, 24, 16], batch=2, channels=32, density=0.2, seed=1))}
LOW = [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)]


@per_place("force_native,dtype,tol", {
    "hip_cpu": [pytest.param(f, torch.float32, 1e-5, marks=pytest.mark.slow) for f in (False, True)],
    "cuda": [(f, dt, tol) for dt, tol in [(torch.float32, 1e-5)] + LOW for f in (False, True)]},
    ids=lambda f, dt, tol: "%s%s" % (f, "" if dt == torch.float32 else "-%s" % str(dt)[6:]))
def test_network_routes_match_cpu(gpu_place, force_native, dtype, tol):
    """A net of grouped layers (depthwise, groups 2/4, 1x1, inverse) through a GPU route vs the CPU route: FP32
    against FP32 to tol; FP16/BF16 against FP64, no worse than twice the CPU route's own error in the same dtype
    (every layer rounds its output, and the ReLU's kinks amplify it)."""
    net, spec = NETWORKS[gpu_place.name]
    x = random_sparse(spec["ndim"], spec["shape"], spec["batch"], spec["channels"], density=spec["density"],
                      seed=spec["seed"])
    ref_t = torch.float32 if dtype == torch.float32 else torch.float64
    want = _run(net(), x, "cpu", ref_t)
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with gpu_place.active():
            got = _run(net(), x, gpu_place.device, dtype)
            # A GPU's schedule varies run to run (the HIP CPU build's fibers do not): the same bits again.
            again = _run(net(), x, gpu_place.device, dtype) if gpu_place.name == "cuda" else got
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    same = _run(net(), x, "cpu", dtype) if dtype != ref_t else want
    assert len(got) == len(want) == len(same)
    for i, (a, b, c, s) in enumerate(zip(got, want, again, same)):
        assert a.dtype == dtype
        bound = max(tol, 2 * rel(s, b)) if dtype != ref_t else tol
        assert rel(a, b) < bound, "item %d: relative error %g, bound %g" % (i, rel(a, b), bound)
        assert torch.equal(a, c)  # deterministic


@pytest.mark.parametrize("cin,cout,groups", [(8, 8, 8), (8, 16, 2)])
def test_dfilter_splits_match_cpu(gpu_place, cin, cout, groups):
    """Enough input rows (>= 512) for the dfilter kernel to split them and add the splits in order."""
    torch.manual_seed(1)
    x = random_sparse(3, [12, 12, 12], 1, cin, density=0.4, seed=5)
    assert x.indices.shape[0] >= 512
    layer = spconv.SubMConv3d(cin, cout, 3, groups=groups, indice_key="k")
    maps = layer(x).indice_dict["k"].maps
    filters = _grouped.weight_to_grouped_filters(layer.weight.detach(), groups)
    _, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout)
    wdx, wdw = cpu.grouped_conv_backward(x.features, filters, dy, nbr_t)
    on = gpu_place.to
    gdx, gdw = gpu_place.ops.grouped_conv_backward(on(x.features), on(filters), on(dy), on(nbr_t))
    assert rel(gdx, wdx) < 1e-5 and rel(gdw, wdw) < 1e-5


@pytest.mark.parametrize("force_native", [False, True])
def test_duplicate_coordinates_match_cpu(gpu_place, force_native):
    """A grouped regular conv over repeated coordinates: the GPU routes split the map into rounds, the CPU sums
    the repeats in its pairs route; same numbers."""
    torch.manual_seed(2)
    x = random_sparse(3, [6, 7, 5], 1, 6, density=0.3, seed=4)
    dup = torch.arange(0, x.indices.shape[0], 4)
    xd = spconv.SparseConvTensor(torch.cat([x.features, torch.randn(len(dup), 6)]),
                                 torch.cat([x.indices, x.indices[dup]]), x.spatial_shape, 1)
    layer = spconv.SparseConv3d(6, 9, 3, 2, 1, groups=3)
    want = _run(layer, xd, "cpu", torch.float32)
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with gpu_place.active():
            got = _run(layer, xd, gpu_place.device, torch.float32)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    for i, (a, b) in enumerate(zip(got, want)):
        assert rel(a, b) < 1e-5, i
