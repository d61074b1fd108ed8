"""Grouped convolution through the GPU code on the CPU (HIP CPU runtime): the grouped kernels and glue
(csrc/hip/grouped_conv.cu, csrc/ops/gpu/grouped_gpu.cpp) op by op against the native CPU route, and grouped
layers through both GPU routes (fused: the table kernels; native: gather, per-group GEMM, scatter) against the
CPU. FP32/FP64 to 1e-5 relative, FP16/BF16 against FP64. Small sizes: every GPU thread is a fiber here."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from spconv.pytorch import _grouped
from support.reference import random_sparse

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv


def rel(a, b):
    return (torch.linalg.norm(a.double() - b.double()) / max(torch.linalg.norm(b.double()).item(), 1e-30)).item()


def _case(kind, cin, cout, groups, dtype=torch.float32, seed=0):
    """(features, filters, maps) of one small layer; maps from the CPU route."""
    torch.manual_seed(seed)
    x = random_sparse(3, [6, 7, 5], 2, cin, density=0.3, seed=seed, dtype=dtype)
    if kind == "subm":
        layer = spconv.SubMConv3d(cin, cout, 3, groups=groups, indice_key="k")
    else:
        layer = spconv.SparseConv3d(cin, cout, 3, 2, 1, groups=groups, indice_key="k")
    y = layer.to(dtype)(x)
    return x.features, _grouped.weight_to_grouped_filters(layer.weight.detach(), groups), y.indice_dict["k"].maps


SHAPES = [("subm", 6, 6, 6), ("subm", 8, 12, 4), ("conv", 9, 6, 3), ("subm", 16, 16, 2), ("conv", 32, 32, 32)]


@pytest.mark.parametrize("kind,cin,cout,groups", SHAPES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_ops_match_cpu(hip_cpu, kind, cin, cout, groups, dtype):
    feats, filters, maps = _case(kind, cin, cout, groups, dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout, dtype=dtype)
    want = cpu.grouped_conv(feats, filters, nbr, nbr_t)
    got = hip_cpu.grouped_conv(feats, filters, nbr, nbr_t)
    assert rel(got, want) < 1e-5
    wdx, wdw = cpu.grouped_conv_backward(feats, filters, dy, nbr_t)
    gdx, gdw = hip_cpu.grouped_conv_backward(feats, filters, dy, nbr_t)
    assert rel(gdx, wdx) < 1e-5 and rel(gdw, wdw) < 1e-5
    pairs = (maps.pair_in, maps.pair_out, maps.pair_offsets)
    got_p = hip_cpu.indice_conv_grouped(feats, filters, *pairs, maps.num_out)
    assert rel(got_p, want) < 1e-5
    pdx, pdw = hip_cpu.indice_conv_grouped_backward(feats, filters, dy, *pairs)
    assert rel(pdx, wdx) < 1e-5 and rel(pdw, wdw) < 1e-5


@pytest.mark.parametrize("dtype,tol", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("kind,cin,cout,groups", SHAPES)
def test_ops_low_precision(hip_cpu, dtype, tol, kind, cin, cout, groups):
    feats, filters, maps = _case(kind, cin, cout, groups, torch.float32)
    feats, filters = feats.to(dtype), filters.to(dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout).to(dtype)
    ref = cpu.grouped_conv(feats.double(), filters.double(), nbr, nbr_t)
    rdx, rdw = cpu.grouped_conv_backward(feats.double(), filters.double(), dy.double(), nbr_t)
    for name in ("table", "pairs"):
        if name == "table":
            y = hip_cpu.grouped_conv(feats, filters, nbr, nbr_t)
            dx, dw = hip_cpu.grouped_conv_backward(feats, filters, dy, nbr_t)
        else:
            pairs = (maps.pair_in, maps.pair_out, maps.pair_offsets)
            y = hip_cpu.indice_conv_grouped(feats, filters, *pairs, maps.num_out)
            dx, dw = hip_cpu.indice_conv_grouped_backward(feats, filters, dy, *pairs)
        assert y.dtype == dx.dtype == dw.dtype == dtype
        assert rel(y, ref) < tol and rel(dx, rdx) < tol and rel(dw, rdw) < tol, name


def _misaligned(t):
    """A copy of t whose data starts one element past an allocation's start: the kernels' vector loads need
    their pointers aligned to the vector, so they fall back to one element at a time."""
    buf = torch.empty(t.numel() + 1, dtype=t.dtype)
    out = buf[1:].view(t.shape)
    out.copy_(t)
    return out


# Grouped (8 output channels per group: 2-8 columns a thread) and depthwise (16 groups a thread in FP16).
@pytest.mark.parametrize("kind,cin,cout,groups", [("subm", 16, 16, 2), ("subm", 32, 32, 32), ("conv", 16, 32, 16)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.float64])
def test_vector_width_keeps_the_bits(hip_cpu, kind, cin, cout, groups, dtype):
    """The kernels move V channels per thread where the pointers allow: with every pointer one element off its
    alignment they run with V = 1, and the results are the same bits (V changes the schedule, not the sums)."""
    feats, filters, maps = _case(kind, cin, cout, groups, torch.float32)
    feats, filters = feats.to(dtype), filters.to(dtype)
    nbr, nbr_t = _grouped.tables(maps, True)
    dy = torch.randn(maps.num_out, cout).to(dtype)
    y = hip_cpu.grouped_conv(feats, filters, nbr, nbr_t)
    dx, dw = hip_cpu.grouped_conv_backward(feats, filters, dy, nbr_t)
    mf, mw, mdy = _misaligned(feats), _misaligned(filters), _misaligned(dy)
    assert all(t.data_ptr() % (2 * t.element_size()) != 0 for t in (mf, mw, mdy))  # no vector of 2 fits
    y1 = hip_cpu.grouped_conv(mf, mw, nbr, nbr_t)
    dx1, dw1 = hip_cpu.grouped_conv_backward(mf, mw, mdy, nbr_t)
    assert torch.equal(y1, y) and torch.equal(dx1, dx) and torch.equal(dw1, dw)
    ref = cpu.grouped_conv(feats.double(), filters.double(), nbr, nbr_t)
    assert rel(y, ref) < (1e-5 if dtype != torch.float16 else 2e-3)


def test_bad_table_raises(hip_cpu):
    feats, filters, maps = _case("subm", 8, 12, 4)
    nbr, nbr_t = _grouped.tables(maps, True)
    bad = nbr.clone()
    bad[3, 1] = feats.shape[0] + 7
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        hip_cpu.grouped_conv(feats, filters, bad, nbr_t)
    with pytest.raises(ValueError, match="filters expect groups"):
        hip_cpu.grouped_conv(feats, filters[:, :2], nbr, nbr_t)


def test_empty(hip_cpu):
    feats = torch.zeros(0, 8)
    filters = torch.randn(27, 4, 2, 3)
    nbr = torch.zeros(0, 27, dtype=torch.int32)
    assert hip_cpu.grouped_conv(feats, filters, nbr, nbr).shape == (0, 12)
    dx, dw = hip_cpu.grouped_conv_backward(feats, filters, torch.zeros(0, 12), nbr)
    assert dx.shape == (0, 8) and torch.equal(dw, torch.zeros_like(filters))


def _net(groups_list, seed=0):
    torch.manual_seed(seed)
    return spconv.SparseSequential(
        spconv.SubMConv3d(8, 8, 3, groups=groups_list[0], indice_key="a"), torch.nn.ReLU(),
        spconv.SparseConv3d(8, 16, 3, 2, 1, groups=groups_list[1], indice_key="d"),
        spconv.SubMConv3d(16, 16, 3, groups=groups_list[2], indice_key="b"),
        spconv.SubMConv3d(16, 16, 1, groups=groups_list[3]),
        spconv.SparseInverseConv3d(16, 8, 3, indice_key="d", groups=groups_list[1]))


def _run(net, x):
    net.zero_grad()
    feats = x.features.clone().requires_grad_(True)
    out = net(spconv.SparseConvTensor(feats, x.indices, x.spatial_shape, x.batch_size))
    g = torch.sin(torch.arange(out.features.numel(), dtype=torch.float64)).view_as(out.features).to(out.features.dtype)
    (out.features * g).sum().backward()
    return out.features.detach(), feats.grad, {n: p.grad.clone() for n, p in net.named_parameters()}


@pytest.mark.slow
@pytest.mark.parametrize("force_native", [False, True])
def test_network_routes_match_cpu(hip_cpu, force_native):
    """A net of grouped layers (depthwise, groups 2/4, 1x1, inverse) through a GPU route vs the CPU route."""
    x = random_sparse(3, [8, 9, 7], 2, 8, density=0.25, seed=3)
    net = _net([8, 2, 4, 4])
    want = _run(net, x)
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with _backend.gpu_code_on_cpu(hip_cpu.name):
            got = _run(net, x)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    assert rel(got[0], want[0]) < 1e-5 and rel(got[1], want[1]) < 1e-5
    for n in want[2]:
        assert rel(got[2][n], want[2][n]) < 1e-5, n


@pytest.mark.parametrize("cin,cout,groups", [(8, 8, 8), (8, 16, 2)])
def test_dfilter_splits_match_cpu(hip_cpu, cin, cout, groups):
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
    gdx, gdw = hip_cpu.grouped_conv_backward(x.features, filters, dy, nbr_t)
    assert rel(gdx, wdx) < 1e-5 and rel(gdw, wdw) < 1e-5


@pytest.mark.parametrize("force_native", [False, True])
def test_duplicate_coordinates_match_cpu(hip_cpu, force_native):
    """A grouped regular conv over repeated coordinates: the GPU routes split the map into rounds, the CPU sums
    the repeats in its pairs route; same numbers."""
    torch.manual_seed(2)
    x = random_sparse(3, [6, 7, 5], 1, 6, density=0.3, seed=4)
    dup = torch.arange(0, x.indices.shape[0], 4)
    xd = spconv.SparseConvTensor(torch.cat([x.features, torch.randn(len(dup), 6)]),
                                 torch.cat([x.indices, x.indices[dup]]), x.spatial_shape, 1)
    layer = spconv.SparseConv3d(6, 9, 3, 2, 1, groups=3)
    want = _run(layer, xd)
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with _backend.gpu_code_on_cpu(hip_cpu.name):
            got = _run(layer, xd)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    assert rel(got[0], want[0]) < 1e-5 and rel(got[1], want[1]) < 1e-5
    for n in want[2]:
        assert rel(got[2][n], want[2][n]) < 1e-5, n
