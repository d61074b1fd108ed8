"""Grouped and depthwise sparse convolution (groups > 1) on the native CPU route: every conv kind and dimension
against dense grouped references (forward, dinput, dfilter), the channel shapes the kernels specialise on,
16-bit and FP64 precision, the ops themselves (opcheck, bad input, empty maps), determinism, torch.compile,
checkpoints and the unchanged groups=1 route."""
import pytest
import torch

import spconv.pytorch as spconv
from support.grouped_reference import grouped_brute_force, grouped_dense, grouped_reference
from support.reference import low_precision_ok, random_sparse
from spconv.pytorch import _grouped

SHAPES = {1: [17], 2: [9, 8], 3: [7, 6, 5], 4: [5, 4, 4, 3]}
CLASSES = {"subm": "SubMConv{}d", "conv": "SparseConv{}d", "deconv": "SparseConvTranspose{}d"}
# (Cin, Cout, groups): depthwise, channel multipliers, 1 / 3 / 8 / 16 channels per group.
CHANNELS = [(4, 4, 4), (3, 6, 3), (6, 9, 3), (8, 8, 2), (16, 16, 8), (12, 24, 4), (16, 32, 2)]


def _layer(kind, nd, cin, cout, groups, k=3, s=1, p=0, d=1, key=None):
    cls = getattr(spconv, CLASSES[kind].format(nd))
    if kind == "subm":
        return cls(cin, cout, k, dilation=d, groups=groups, indice_key=key)
    return cls(cin, cout, k, s, p, d, groups=groups, indice_key=key)


def _check(layer, x, groups, kind, s, p, d, atol=1e-4):
    """The layer's output and gradients against the FP64 grouped reference."""
    nd = len(x.spatial_shape)
    x.features.requires_grad_(True)
    out = layer(x)
    grad = torch.randn_like(out.features)
    (out.features * grad).sum().backward()
    x64 = spconv.SparseConvTensor(x.features.detach().double().requires_grad_(True), x.indices, x.spatial_shape,
                                  x.batch_size)
    w64 = layer.weight.detach().double().requires_grad_(True)
    ref = grouped_reference(kind, x64, w64, groups, out.indices, out.spatial_shape, [s] * nd, [p] * nd, [d] * nd)
    if layer.bias is not None:
        ref = ref + layer.bias.detach().double()
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(out.features.double(), ref.detach(), atol=atol, rtol=atol)
    torch.testing.assert_close(x.features.grad.double(), x64.features.grad, atol=atol, rtol=atol)
    torch.testing.assert_close(layer.weight.grad.double(), w64.grad, atol=atol, rtol=atol)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("kind,k,s,p,d", [("subm", 3, 1, 0, 1), ("subm", 3, 1, 0, 2), ("conv", 3, 2, 1, 1),
                                          ("conv", 2, 1, 0, 2), ("deconv", 3, 2, 1, 1), ("deconv", 2, 2, 0, 1)])
@pytest.mark.parametrize("cin,cout,groups", CHANNELS[:4])
def test_grouped_matches_dense(nd, kind, k, s, p, d, cin, cout, groups):
    torch.manual_seed(nd * 7 + groups)
    layer = _layer(kind, nd, cin, cout, groups, k, s, p, d)
    x = random_sparse(nd, SHAPES[nd], 2, cin, density=0.4, seed=nd + cin)
    _check(layer, x, groups, kind, s, p, d)


@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("cin,cout,groups", [(4, 4, 4), (6, 9, 3)])
def test_inverse_grouped(nd, cin, cout, groups):
    """A grouped SparseConv with a key, then a grouped SparseInverseConv restores its input sites."""
    torch.manual_seed(nd)
    down = getattr(spconv, f"SparseConv{nd}d")(cin, cout, 3, 2, 1, groups=groups, indice_key="down")
    inv = getattr(spconv, f"SparseInverseConv{nd}d")(cout, cin, 3, indice_key="down", groups=groups)
    x = random_sparse(nd, SHAPES[nd], 2, cin, seed=nd)
    y = down(x)
    y = y.replace_feature(y.features.detach())
    z = _check_inverse(inv, y, x, groups)
    assert torch.equal(z.indices, x.indices)


def _check_inverse(inv, y, x, groups):
    nd = len(x.spatial_shape)
    y.features.requires_grad_(True)
    z = inv(y)
    grad = torch.randn_like(z.features)
    (z.features * grad).sum().backward()
    y64 = spconv.SparseConvTensor(y.features.detach().double().requires_grad_(True), y.indices, y.spatial_shape,
                                  y.batch_size)
    w64 = inv.weight.detach().double().requires_grad_(True)
    ref = grouped_reference("inverse", y64, w64, groups, x.indices, x.spatial_shape, [2] * nd, [1] * nd, [1] * nd)
    ref = ref + inv.bias.detach().double()
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(z.features.double(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y.features.grad.double(), y64.features.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(inv.weight.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)
    return z


# Channel shapes the CPU kernels specialise on: depthwise with whole vector tiles, a masked tail and several
# tiles; groups with 8 outputs per group (AVX2 tiles), 16 outputs from 8 inputs (AVX-512 row tiles, one group and
# eight groups at once), 16/32/80 channels per group (pairs bucketed by offset, 1-4 vector tails), 3 (portable
# loops) and 1 -> 2 (a channel multiplier).
@pytest.mark.slow
@pytest.mark.parametrize("cin,cout,groups", [(64, 64, 64), (40, 40, 40), (136, 136, 136), (32, 32, 4),
                                             (32, 64, 4), (64, 128, 8), (64, 64, 4), (128, 128, 8), (128, 128, 4),
                                             (160, 160, 2), (48, 48, 2), (9, 9, 3), (8, 16, 8), (16, 16, 16)])
def test_channel_shapes_subm3d(cin, cout, groups):
    torch.manual_seed(cin + groups)
    layer = _layer("subm", 3, cin, cout, groups)
    x = random_sparse(3, [12, 11, 10], 2, cin, density=0.35, seed=cin)  # > 1 row block, > 1 row task
    _check(layer, x, groups, "subm", 1, 0, 1)


@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_conv1x1_grouped(nd, kind):
    """Kernel volume 1: the identity table, no kernel map; the weight reads as [Cout, 1.., Cin/groups]."""
    torch.manual_seed(nd)
    layer = _layer(kind, nd, 8, 12, 4, k=1)
    assert layer.conv1x1
    x = random_sparse(nd, SHAPES[nd], 2, 8, seed=nd)
    _check(layer, x, 4, "subm", 1, 0, 1)


@pytest.mark.parametrize("dtype,rel", [(torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("cin,cout,groups", [(64, 64, 64), (32, 32, 4), (9, 9, 3)])
def test_low_precision(dtype, rel, cin, cout, groups):
    torch.manual_seed(0)
    layer = _layer("subm", 3, cin, cout, groups).to(dtype)
    x = random_sparse(3, [8, 8, 8], 1, cin, density=0.4, seed=1)
    xl = x.replace_feature(x.features.to(dtype).requires_grad_(True))
    out = layer(xl)
    grad = torch.randn(out.features.shape, dtype=torch.float64)
    (out.features * grad.to(dtype)).sum().backward()
    outs = {}
    for ref_t in (torch.float32, torch.float64):
        ref_layer = _layer("subm", 3, cin, cout, groups).to(ref_t)
        with torch.no_grad():
            ref_layer.weight.copy_(layer.weight.to(ref_t))
            ref_layer.bias.copy_(layer.bias.to(ref_t))
        xr = x.replace_feature(xl.features.detach().to(ref_t).requires_grad_(True))
        o = ref_layer(xr)
        (o.features * grad.to(ref_t)).sum().backward()
        outs[ref_t] = (o.features.detach(), xr.features.grad, ref_layer.weight.grad)
    for got, want32, want64 in zip((out.features, xl.features.grad, layer.weight.grad), outs[torch.float32],
                                   outs[torch.float64]):
        assert got.dtype == dtype
        assert low_precision_ok(got.float() - want32, cin, cout)
        assert float((got.double() - want64).norm()) <= rel * float(want64.norm())


def test_float64_tight():
    layer = _layer("conv", 3, 12, 12, 4, 3, 2, 1).double()
    x = random_sparse(3, SHAPES[3], 2, 12, dtype=torch.float64, seed=4)
    _check(layer, x, 4, "conv", 2, 1, 1, atol=1e-10)


def test_references_agree():
    """F.conv3d(groups=g) and the per-group brute force agree, so the 4D reference is trustworthy."""
    x = random_sparse(3, SHAPES[3], 2, 6, dtype=torch.float64, seed=2)
    for kind, s in (("subm", 1), ("conv", 2), ("deconv", 2)):
        layer = _layer(kind, 3, 6, 9, 3, 3, s, 1 if kind != "subm" else 0).double()
        out = layer(x)
        args = (kind, x, layer.weight.detach(), 3, out.indices, out.spatial_shape, [s] * 3,
                [1 if kind != "subm" else 0] * 3, [1] * 3)
        torch.testing.assert_close(grouped_dense(*args), grouped_brute_force(*args))


# ---- the module surface ----
def test_bad_groups_raise():
    with pytest.raises(ValueError, match=r"in_channels \(8\) and out_channels \(6\).*groups \(4\)"):
        spconv.SubMConv3d(8, 6, 3, groups=4)
    with pytest.raises(ValueError, match=r"in_channels \(6\) and out_channels \(8\)"):
        spconv.SparseConv2d(6, 8, 3, groups=4)
    for bad in (0, -2, 1.5, True):
        with pytest.raises(ValueError, match="groups must be a positive int"):
            spconv.SubMConv3d(8, 8, 3, groups=bad)


def test_weight_shape_state_dict_repr():
    m = spconv.SubMConv3d(16, 32, (3, 1, 3), groups=4, indice_key="a")
    assert list(m.weight.shape) == [32, 3, 1, 3, 4] == m.weight_shape
    assert "groups=4" in repr(m)
    assert "groups" not in repr(spconv.SubMConv3d(16, 32, 3))
    sd = m.state_dict()
    assert list(sd["weight"].shape) == [32, 3, 1, 3, 4]
    m2 = spconv.SubMConv3d(16, 32, (3, 1, 3), groups=4)
    m2.load_state_dict(sd)
    assert torch.equal(m2.weight, m.weight)
    # groups=1 keeps spconv 2.x's shape.
    assert list(spconv.SparseConv3d(16, 32, 3).weight.shape) == [32, 3, 3, 3, 16]


def test_spconv1_layout_checkpoint_converts():
    """The spconv 1.x (RSCK) load hook knows a grouped weight holds Cin/groups channels."""
    m = spconv.SubMConv3d(8, 12, (3, 2, 1), groups=4)
    rsck = m.weight.detach().permute(1, 2, 3, 4, 0).contiguous()  # [*k, Cin/g, Cout]
    m2 = spconv.SubMConv3d(8, 12, (3, 2, 1), groups=4)
    m2.load_state_dict({"weight": rsck, "bias": m.bias.detach()})
    assert torch.equal(m2.weight, m.weight)


def test_groups_one_unchanged_bitwise():
    """groups=1 keeps the dense route: the layer's output is the dense op's, bit for bit."""
    from spconv.pytorch import ops
    from spconv.pytorch.functional import weight_to_filters
    torch.manual_seed(0)
    layer = spconv.SubMConv3d(16, 24, 3, groups=1, bias=False, indice_key="s")
    x = random_sparse(3, [10, 10, 10], 1, 16, seed=3)
    y = layer(x)
    maps = y.indice_dict["s"].maps
    assert torch.equal(y.features, ops.indice_conv_native(x.features, weight_to_filters(layer.weight), maps,
                                                          y.features.shape[0]))


def test_empty_input_flows():
    for kind in ("subm", "conv", "deconv"):
        layer = _layer(kind, 3, 8, 8, 8, 3, 2 if kind != "subm" else 1, 1 if kind != "subm" else 0)
        x = spconv.SparseConvTensor(torch.zeros(0, 8, requires_grad=True), torch.zeros(0, 4, dtype=torch.int32),
                                    [6, 6, 6], 1)
        y = layer(x)
        assert y.features.shape == (0, 8)
        y.features.sum().backward()
        assert x.features.grad.shape == (0, 8)
        assert torch.equal(layer.weight.grad, torch.zeros_like(layer.weight))
    one = spconv.SubMConv3d(8, 8, 1, groups=2)
    x = spconv.SparseConvTensor(torch.zeros(0, 8), torch.zeros(0, 4, dtype=torch.int32), [6, 6, 6], 1)
    assert one(x).features.shape == (0, 8)


def test_duplicate_coordinates_sum():
    """A regular conv over repeated coordinates acts on one site holding their summed features (the pairs route
    sums repeats on the CPU)."""
    torch.manual_seed(0)
    x = random_sparse(3, SHAPES[3], 1, 6, seed=9)
    n = x.indices.shape[0]
    dup = torch.arange(0, n, 3)
    f1 = torch.randn(len(dup), 6)
    xd = spconv.SparseConvTensor(torch.cat([x.features, f1]), torch.cat([x.indices, x.indices[dup]]),
                                 x.spatial_shape, 1)
    merged = x.features.clone()
    merged[dup] += f1
    layer = _layer("conv", 3, 6, 9, 3, 3, 2, 1)
    a = layer(xd)
    b = layer(x.replace_feature(merged))
    torch.testing.assert_close(a.dense(), b.dense(), atol=1e-5, rtol=1e-5)


# ---- the ops ----
def _ops_case(cin=8, cout=12, groups=4, seed=0, dtype=torch.float32):
    torch.manual_seed(seed)
    x = random_sparse(3, [6, 6, 6], 1, cin, density=0.4, seed=seed, dtype=dtype)
    layer = _layer("subm", 3, cin, cout, groups, key="k").to(dtype)
    y = layer(x)
    maps = y.indice_dict["k"].maps
    filters = _grouped.weight_to_grouped_filters(layer.weight.detach(), groups)
    nbr, nbr_t = _grouped.tables(maps, True)
    return x.features, filters, maps, nbr, nbr_t


def test_table_and_pairs_ops_agree():
    feats, filters, maps, nbr, nbr_t = _ops_case()
    a = torch.ops.spconv.grouped_conv(feats, filters, nbr, nbr_t)
    b = torch.ops.spconv.indice_conv_grouped(feats, filters, maps.pair_in, maps.pair_out, maps.pair_offsets,
                                             maps.num_out)
    assert torch.equal(a, b)
    dy = torch.randn_like(a)
    da = torch.ops.spconv.grouped_conv_backward(feats, filters, dy, nbr_t)
    db = torch.ops.spconv.indice_conv_grouped_backward(feats, filters, dy, maps.pair_in, maps.pair_out,
                                                       maps.pair_offsets)
    assert torch.equal(da[0], db[0]) and torch.equal(da[1], db[1])


@pytest.mark.parametrize("cin,cout,groups", [(8, 12, 4), (6, 6, 6)])
def test_opcheck(cin, cout, groups):
    feats, filters, maps, nbr, nbr_t = _ops_case(cin, cout, groups, dtype=torch.float64)
    feats = feats.detach().requires_grad_(True)
    filters = filters.requires_grad_(True)
    dy = torch.randn(nbr.shape[0], cout, dtype=torch.float64)
    torch.library.opcheck(torch.ops.spconv.grouped_conv, (feats, filters, nbr, nbr_t))
    torch.library.opcheck(torch.ops.spconv.grouped_conv_backward, (feats.detach(), filters.detach(), dy, nbr_t))
    pairs = (maps.pair_in, maps.pair_out, maps.pair_offsets)
    torch.library.opcheck(torch.ops.spconv.indice_conv_grouped, (feats, filters, *pairs, maps.num_out))
    torch.library.opcheck(torch.ops.spconv.indice_conv_grouped_backward,
                          (feats.detach(), filters.detach(), dy, *pairs))


# cig 16: the bucketed forward of wide groups; 3: the row loop; depthwise: its own row loop. Entry 3 lies in the
# first vector of a row's compaction, the next-to-last one in its partial last vector (27 = 8 + 8 + 8 + 3).
@pytest.mark.parametrize("cig,cout,groups", [(3, 64, 4), (16, 64, 4), (1, 48, 48)])
def test_table_entries_out_of_range_raise(cig, cout, groups):
    feats, filters, _, nbr, nbr_t = _ops_case(cin=groups * cig, cout=cout, groups=groups)
    good = torch.ops.spconv.grouped_conv(feats, filters, nbr, nbr_t)
    for value in (feats.shape[0], -5, -2 ** 31, 2 ** 31 - 1):  # the extremes of an unsigned compare
        for entry in (3, nbr.shape[1] - 2):
            bad = nbr.clone()
            bad[-1, entry] = value
            with pytest.raises(ValueError, match="nbr holds rows outside"):
                torch.ops.spconv.grouped_conv(feats, filters, bad, nbr_t)
    assert torch.equal(torch.ops.spconv.grouped_conv(feats, filters, nbr, nbr_t), good)


def test_ops_bad_input_raise():
    feats, filters, maps, nbr, nbr_t = _ops_case()
    op = torch.ops.spconv.grouped_conv
    bad = nbr.clone()
    bad[0, 0] = feats.shape[0]
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        op(feats, filters, bad, nbr_t)
    bad[0, 0] = -5
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        op(feats, filters, bad, nbr_t)
    bad_t = nbr_t.clone()
    bad_t[1, 2] = 10 ** 6
    with pytest.raises(ValueError, match="nbr_t holds rows outside"):
        torch.ops.spconv.grouped_conv_backward(feats, filters, torch.zeros(nbr.shape[0], 12), bad_t)
    with pytest.raises(ValueError, match="filters expect groups 4 x 3 = 12 input channels"):
        op(feats, torch.zeros(27, 4, 3, 3), nbr, nbr_t)
    with pytest.raises(ValueError, match="filters must be"):
        op(feats, filters[0], nbr, nbr_t)
    with pytest.raises(TypeError, match="nbr must be int32"):
        op(feats, filters, nbr.long(), nbr_t)
    with pytest.raises(TypeError, match="filters dtype"):
        op(feats, filters.double(), nbr, nbr_t)
    with pytest.raises(ValueError, match="nbr_t must have one row per input"):
        torch.ops.spconv.grouped_conv_backward(feats, filters, torch.zeros(nbr.shape[0], 12), nbr_t[:0])
    with pytest.raises(ValueError, match="out_grad has"):
        torch.ops.spconv.grouped_conv_backward(feats, filters, torch.zeros(nbr.shape[0], 5), nbr_t)
    with pytest.raises(ValueError, match="pair_in holds rows outside"):
        torch.ops.spconv.indice_conv_grouped(feats[:3], filters, maps.pair_in, maps.pair_out, maps.pair_offsets,
                                             maps.num_out)
    with pytest.raises(ValueError, match="num_out must be >= 0"):
        torch.ops.spconv.indice_conv_grouped(feats, filters, maps.pair_in, maps.pair_out, maps.pair_offsets, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_two_pass_backward_offsets_without_pairs(dtype):
    """Voxels on one line along x: the SubM offsets that step in z or y have no pairs, and their dW must be exactly
    zero on the two-pass backward (16 channels per group), even in memory a previous backward left non-zero."""
    torch.manual_seed(0)
    xs = torch.arange(0, 40, dtype=torch.int32)
    idx = torch.stack([torch.zeros_like(xs), torch.full_like(xs, 3), torch.full_like(xs, 3), xs], 1)
    layer = _layer("subm", 3, 64, 64, 4).to(dtype)
    dense = random_sparse(3, [7, 7, 40], 1, 64, density=0.5, seed=5)
    layer(dense.replace_feature(dense.features.to(dtype))).features.sum().backward()  # fills a dW buffer
    layer.weight.grad = None  # ... and frees it for the next one
    x = spconv.SparseConvTensor(torch.randn(len(xs), 64, dtype=dtype), idx, [7, 7, 40], 1)
    _check(layer, x, 4, "subm", 1, 0, 1, atol=1e-4 if dtype == torch.float32 else 1e-10)
    grad = layer.weight.grad  # [Cout, kz, ky, kx, Cin/G]
    off_line = torch.ones(3, 3, 3, dtype=torch.bool)
    off_line[1, 1, :] = False  # only the offsets along x pair two voxels
    assert torch.count_nonzero(grad[:, off_line]) == 0
    assert torch.count_nonzero(grad[:, 1, 1, 1]) > 0


def test_deterministic_across_threads():
    torch.manual_seed(0)
    x = random_sparse(3, [24, 24, 16], 1, 128, density=0.3, seed=2)
    results = []
    old = torch.get_num_threads()
    try:
        for threads in (1, 2, 1):
            torch.set_num_threads(threads)
            outs = []
            # depthwise; the single-pass backward (4 channels per group); the two-pass backward with the fused dW
            # (16 and 32 channels per group)
            for groups in (128, 32, 8, 4):
                torch.manual_seed(1)
                layer = _layer("subm", 3, 128, 128, groups)
                xf = x.replace_feature(x.features.clone().requires_grad_(True))
                y = layer(xf)
                (y.features * torch.arange(y.features.numel()).view_as(y.features).sin()).sum().backward()
                outs += [y.features.detach(), xf.features.grad, layer.weight.grad]
            results.append(outs)
    finally:
        torch.set_num_threads(old)
    for a, b in zip(results[0], results[1]):
        assert torch.equal(a, b)
    for a, b in zip(results[0], results[2]):
        assert torch.equal(a, b)


@pytest.mark.slow
def test_torch_compile_grouped_net():
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(8, 8, 3, groups=8, indice_key="a"), torch.nn.ReLU(),
                                  spconv.SubMConv3d(8, 16, 3, groups=4, indice_key="a"),
                                  spconv.SparseConv3d(16, 16, 3, 2, 1, groups=2),
                                  spconv.SubMConv3d(16, 16, 1, groups=4))
    x = random_sparse(3, [8, 8, 8], 1, 8, density=0.3, seed=1)
    want = net(x).features
    compiled = torch.compile(lambda t: net(t).features, backend="aot_eager", fullgraph=False)
    got = compiled(x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    xg = x.replace_feature(x.features.clone().requires_grad_(True))
    compiled(xg).sum().backward()
    assert xg.features.grad is not None and xg.features.grad.abs().sum() > 0


class _GroupedModel(torch.nn.Module):
    """Dense tensors in, dense tensors out (as test_compile's model), every grouped route inside."""

    def __init__(self):
        super().__init__()
        self.net = spconv.SparseSequential(
            spconv.SubMConv3d(8, 8, 3, groups=8, indice_key="a"), torch.nn.ReLU(),
            spconv.SubMConv3d(8, 16, 3, groups=4, indice_key="a"),
            spconv.SparseConv3d(16, 16, 3, 2, 1, groups=2, indice_key="d"),
            spconv.SubMConv3d(16, 16, 1, groups=4),
            spconv.SparseInverseConv3d(16, 8, 3, indice_key="d", groups=8))

    def forward(self, features, indices):
        return self.net(spconv.SparseConvTensor(features, indices, [8, 8, 8], 1)).features


def test_fullgraph_dynamic_inference_bitwise():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = _GroupedModel().eval()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
        for seed, density in ((0, 0.3), (1, 0.15)):
            x = random_sparse(3, [8, 8, 8], 1, 8, density=density, seed=seed)
            assert torch.equal(compiled(x.features, x.indices), model(x.features, x.indices))
