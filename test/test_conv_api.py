"""Convolution behaviour beyond the numbers: indice_key reuse, inverse round trip, checkpoints, empty inputs,
low precision, gradcheck and opcheck of the registered ops (issue: foundation)."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv.pytorch import ops
from support.reference import dense_reference, low_precision_ok, random_sparse


def _scene(seed=0, channels=4, batch=2, shape=(8, 9, 7), density=0.2):
    return random_sparse(3, list(shape), batch, channels, density=density, seed=seed)


def test_subm_keeps_rows_and_shares_key():
    x = _scene()
    c1, c2 = spconv.SubMConv3d(4, 8, 3, indice_key="s1"), spconv.SubMConv3d(8, 8, 3, indice_key="s1")
    a = c1(x)
    assert torch.equal(a.indices, x.indices)
    assert "s1" in a.indice_dict and "s1" not in x.indice_dict  # outputs carry a copy, like spconv 2.x
    b = c2(a)
    assert torch.equal(b.indices, x.indices)
    assert b.indice_dict["s1"] is a.indice_dict["s1"]  # the second layer reused the stored map


def test_reuse_key_checks():
    x = _scene()
    a = spconv.SubMConv3d(4, 4, 3, indice_key="k")(x)
    with pytest.raises(ValueError, match="kernel_size"):
        spconv.SubMConv3d(4, 4, 5, indice_key="k")(a)
    with pytest.raises(ValueError, match="dilation"):
        spconv.SubMConv3d(4, 4, 3, dilation=2, indice_key="k")(a)
    with pytest.raises(ValueError, match="already exists"):
        spconv.SparseConv3d(4, 4, 3, indice_key="k")(a)
    with pytest.raises(ValueError, match="no kernel map"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="missing")(a)
    with pytest.raises(ValueError, match="submanifold"):
        spconv.SparseInverseConv3d(4, 4, 3, indice_key="k")(a)
    down = spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="d")(a)
    with pytest.raises(ValueError, match="kernel_size"):
        spconv.SparseInverseConv3d(4, 4, 2, indice_key="d")(down)


def test_reused_subm_map_gives_same_result():
    x = _scene(seed=2)
    conv = spconv.SubMConv3d(4, 4, 3, indice_key="r")
    fresh = conv(x)
    again = conv(fresh.replace_feature(x.features))  # pairs looked up under "r"
    torch.testing.assert_close(fresh.features, again.features)


def test_inverse_round_trip_unet_shapes():
    x = _scene(seed=4)
    down = spconv.SparseConv3d(4, 8, 3, 2, 1, indice_key="d1")
    up = spconv.SparseInverseConv3d(8, 4, 3, indice_key="d1")
    y = down(x)
    z = up(y)
    assert torch.equal(z.indices, x.indices) and z.spatial_shape == x.spatial_shape
    assert z.features.shape == (x.features.shape[0], 4)


def test_state_dict_as_spconv2_saves_it():
    """Parameter names and shapes of spconv 2.x: weight [Cout, *k, Cin], bias [Cout]."""
    conv = spconv.SparseConv3d(3, 5, (3, 1, 2), 2, bias=True)
    sd = conv.state_dict()
    assert set(sd) == {"weight", "bias"}
    assert sd["weight"].shape == (5, 3, 1, 2, 3) and sd["bias"].shape == (5,)
    saved = {"weight": torch.randn(5, 3, 1, 2, 3), "bias": torch.randn(5)}
    other = spconv.SparseConv3d(3, 5, (3, 1, 2), 2)
    other.load_state_dict(saved)
    x = _scene(channels=3)
    out = other(x)
    ref = dense_reference("conv", x, saved["weight"], out.indices, out.spatial_shape, [2] * 3, [0] * 3, [1] * 3,
                          saved["bias"])
    torch.testing.assert_close(out.features, ref, atol=1e-4, rtol=1e-4)


def test_conv1x1_reinterprets_weight_like_spconv2():
    conv = spconv.SubMConv3d(3, 5, 1, bias=False)
    x = _scene(channels=3)
    out = conv(x)
    torch.testing.assert_close(out.features, x.features @ conv.weight.view(3, 5))
    assert not torch.allclose(out.features, x.features @ conv.weight.view(5, 3).t())


def test_conv1x1_padding_rejected_like_spconv2():
    with pytest.raises(ValueError, match="padding"):
        spconv.SparseConv3d(3, 5, 1, 1, 1)


@pytest.mark.parametrize("kind", ["subm", "conv", "deconv", "inverse"])
def test_empty_input_flows(kind):
    x = spconv.SparseConvTensor(torch.zeros(0, 4, requires_grad=True), torch.zeros(0, 4, dtype=torch.int32),
                                [6, 6, 6], 2)
    if kind == "subm":
        layer = spconv.SubMConv3d(4, 3, 3)
    elif kind == "conv":
        layer = spconv.SparseConv3d(4, 3, 3, 2)
    elif kind == "deconv":
        layer = spconv.SparseConvTranspose3d(4, 3, 3, 2)
    else:
        layer = spconv.SparseSequential(spconv.SparseConv3d(4, 4, 3, 2, indice_key="e"),
                                        spconv.SparseInverseConv3d(4, 3, 3, indice_key="e"))
    out = layer(x)
    assert out.features.shape == (0, 3) and out.indices.shape == (0, 4)
    out.features.sum().backward()
    assert x.features.grad.shape == (0, 4)
    assert out.dense().shape[:2] == (2, 3)


def test_output_with_no_active_sites():
    """A single site that a stride-3 conv without padding cannot reach: empty output, not a crash."""
    x = spconv.SparseConvTensor(torch.randn(1, 2, requires_grad=True), torch.tensor([[0, 2, 2, 2]], dtype=torch.int32),
                                [5, 5, 5], 1)
    out = spconv.SparseConv3d(2, 3, 2, 3)(x)
    assert out.features.shape == (0, 3)
    out.features.sum().backward()
    assert torch.equal(x.features.grad, torch.zeros(1, 2))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_low_precision_against_fp32(dtype, kind):
    cin, cout = 16, 32
    x32 = random_sparse(3, [10, 10, 10], 2, cin, density=0.2, seed=7)
    layer = (spconv.SubMConv3d(cin, cout, 3) if kind == "subm" else spconv.SparseConv3d(cin, cout, 3, 2, 1))
    ref = layer(x32)
    low = layer.to(dtype)(x32.replace_feature(x32.features.to(dtype)))
    assert low.features.dtype == dtype
    assert torch.equal(low.indices, ref.indices)
    assert low_precision_ok(low.features.float() - ref.features, cin, cout)


def test_low_precision_backward():
    cin, cout = 16, 16
    x = random_sparse(3, [8, 8, 8], 1, cin, density=0.3, seed=8)
    layer = spconv.SubMConv3d(cin, cout, 3)
    xf = x.features.clone().requires_grad_(True)
    layer(x.replace_feature(xf)).features.square().sum().backward()
    g32, w32 = xf.grad, layer.weight.grad.clone()
    layer.zero_grad()
    layer = layer.to(torch.bfloat16)
    xb = x.features.to(torch.bfloat16).requires_grad_(True)
    layer(x.replace_feature(xb)).features.float().square().sum().backward()
    assert xb.grad.dtype == torch.bfloat16 and layer.weight.grad.dtype == torch.bfloat16
    assert low_precision_ok(xb.grad.float() - g32, cin, cout)
    assert low_precision_ok(layer.weight.grad.float() - w32, cin, cout)


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["subm", "conv", "deconv"])
def test_gradcheck_fp64(kind):
    x = random_sparse(3, [5, 4, 5], 2, 2, density=0.3, seed=9)
    layer = {"subm": spconv.SubMConv3d(2, 3, 3), "conv": spconv.SparseConv3d(2, 3, 3, 2, 1),
             "deconv": spconv.SparseConvTranspose3d(2, 3, 3, 2)}[kind].double()
    out = layer(x.replace_feature(x.features.double()))
    _, maps = ops.build_kernel_map(x.indices, 2, x.spatial_shape, out.spatial_shape, layer.kernel_size,
                                   layer.stride, layer.padding, layer.dilation, layer.subm, layer.transposed)

    def f(feats, weight):
        return spconv.functional.conv_features(feats, spconv.functional.weight_to_filters(weight), maps,
                                               out.features.shape[0])

    feats = x.features.double().requires_grad_(True)
    weight = layer.weight.detach().clone().requires_grad_(True)
    assert torch.autograd.gradcheck(f, (feats, weight))


def test_bias_and_activation_train_and_eval():
    x = _scene(seed=11)
    conv = spconv.SubMConv3d(4, 6, 3, bias=True, act_type="ReLU")
    plain = spconv.SubMConv3d(4, 6, 3, bias=True)
    plain.load_state_dict(conv.state_dict())
    for mode in (True, False):
        conv.train(mode)
        plain.train(mode)
        torch.testing.assert_close(conv(x).features, torch.relu(plain(x).features))
    leaky = spconv.SubMConv3d(4, 6, 3, act_type="LeakyReLU", act_alpha=0.1)
    leaky.load_state_dict(conv.state_dict())
    torch.testing.assert_close(leaky(x).features, torch.nn.functional.leaky_relu(plain(x).features, 0.1))
    with pytest.raises(ValueError, match="act_type"):
        spconv.SubMConv3d(4, 6, 3, act_type="Swish")


@pytest.mark.parametrize("ndim,shape,batch", [(1, [11], 3), (2, [5, 7], 2), (3, [4, 6, 5], 3), (4, [3, 4, 2, 5], 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.int32])
def test_dense_writes_each_row_at_its_site_and_zero_elsewhere(ndim, shape, batch, dtype):
    x = random_sparse(ndim, shape, batch, 6, density=0.3, seed=ndim)
    x = x.replace_feature((x.features * 100).to(dtype))
    want = torch.zeros([batch, 6] + shape, dtype=dtype)
    for row, site in zip(x.features, x.indices.long().tolist()):  # one row at a time: nothing shared with dense()
        want[(site[0], slice(None), *site[1:])] = row
    got = x.dense()
    assert got.is_contiguous() and torch.equal(got, want)
    assert torch.equal(x.dense(channels_first=False), want.movedim(1, -1))


def test_dense_gradient_is_the_dense_gradient_at_each_row():
    x = random_sparse(3, [4, 6, 5], 2, 5, density=0.3, seed=3, dtype=torch.float64)
    feats = x.features.clone().requires_grad_()
    g = torch.randn([2, 5, 4, 6, 5], dtype=torch.float64)
    (x.replace_feature(feats).dense() * g).sum().backward()
    idx = x.indices.long()
    assert torch.equal(feats.grad, g[idx[:, 0], :, idx[:, 1], idx[:, 2], idx[:, 3]])
    empty = spconv.SparseConvTensor(torch.zeros(0, 5, requires_grad=True), torch.zeros(0, 4, dtype=torch.int32),
                                    [4, 6, 5], 2)
    d = empty.dense()
    assert d.shape == (2, 5, 4, 6, 5) and not d.any()
    d.sum().backward()
    assert empty.features.grad.shape == (0, 5)


def test_sparse_conv_tensor_api():
    x = _scene(seed=12)
    assert x.spatial_size == 8 * 9 * 7
    with pytest.raises(ValueError, match="replace_feature"):
        x.features = x.features
    y = x.replace_feature(x.features * 2)
    assert y.indice_dict is x.indice_dict
    s = x.shadow_copy()
    assert s.indice_dict is x.indice_dict and s.features is x.features
    d = x.dense()
    assert d.shape == (2, 4, 8, 9, 7)
    assert torch.equal(x.dense(channels_first=False), d.permute(0, 2, 3, 4, 1))
    back = spconv.SparseConvTensor.from_dense(x.dense(channels_first=False))
    assert torch.equal(back.dense(), d)
    summed = x + y
    torch.testing.assert_close(summed.features, x.features * 3)
    torch.testing.assert_close((x.features + x).features, x.features * 2)
    assert x.find_indice_pair(None) is None and x.find_indice_pair("nope") is None


def _op_samples():
    x = random_sparse(3, [6, 5, 6], 2, 3, density=0.3, seed=13)
    out_idx, pi, po, off, _, _ = torch.ops.spconv.get_indice_pairs(x.indices, 2, [6, 5, 6], [3, 3, 3], [3, 3, 3],
                                                             [2, 2, 2], [1, 1, 1], [1, 1, 1], False, False)
    filters = torch.randn(27, 3, 4, requires_grad=True)
    return x, out_idx, pi, po, off, filters


def test_opcheck_get_indice_pairs():
    x = random_sparse(3, [6, 5, 6], 2, 3, density=0.3, seed=13)
    for subm in (True, False):
        torch.library.opcheck(torch.ops.spconv.get_indice_pairs.default,
                              (x.indices, 2, [6, 5, 6], [6, 5, 6] if subm else [3, 3, 3], [3, 3, 3],
                               [1, 1, 1] if subm else [2, 2, 2], [1, 1, 1], [1, 1, 1], subm, False),
                              test_utils=("test_schema", "test_faketensor"))


def test_opcheck_indice_conv():
    x, out_idx, pi, po, off, filters = _op_samples()
    feats = x.features.clone().requires_grad_(True)
    torch.library.opcheck(torch.ops.spconv.indice_conv.default, (feats, filters, pi, po, off, out_idx.shape[0]))
    grad = torch.randn(out_idx.shape[0], 4)
    torch.library.opcheck(torch.ops.spconv.indice_conv_backward.default,
                          (x.features, filters.detach(), grad, pi, po, off))
