"""Convolution accuracy against dense references: the four conv kinds x 1-4D x kernel sizes, strides, paddings,
dilations and batch sizes; forward, dinput and dfilter (issue: foundation)."""
import itertools

import pytest
import torch

import spconv.pytorch as spconv
from support.reference import brute_force, conv1x1_weight, dense_reference, random_sparse

SHAPES = {1: [17], 2: [9, 8], 3: [7, 6, 5], 4: [5, 4, 4, 3]}
MIXED = {1: (3,), 2: (3, 1), 3: (3, 1, 3), 4: (3, 1, 3, 1)}
CIN, COUT = 3, 4


def _kernels(nd):
    return [(k,) * nd for k in (1, 2, 3, 5)] + [MIXED[nd]]


def _out_shape(shape, k, s, p, d):
    return [(i + 2 * pp - dd * (kk - 1) - 1) // ss + 1 for i, kk, ss, pp, dd in zip(shape, k, s, p, d)]


# (stride, padding, dilation, batch) combinations: every value of each parameter appears with several
# values of the others, without the full product (which would take far too long on a small CPU).
_SPDB = [(1, 0, 1, 1), (1, 1, 2, 3), (1, 2, 1, 1), (1, 0, 2, 1), (2, 0, 1, 3), (2, 1, 1, 1), (2, 2, 1, 3),
         (3, 0, 1, 1), (3, 1, 1, 3)]


def _cases(kind):
    for nd in (1, 2, 3, 4):
        for k in _kernels(nd):
            if kind == "subm":
                for d, b in itertools.product((1, 2), (1, 3)):
                    yield nd, k, 1, 0, d, b
                continue
            for s, p, d, b in _SPDB:  # spconv supports stride > 1 or dilation > 1, not both
                if nd == 4 and b == 3:
                    b = 2  # keep the brute-force 4D cases small
                if any(p >= kk * d for kk in k if kk > 1) or (all(kk == 1 for kk in k) and p > 0):
                    continue  # padding beyond the kernel extent only adds empty borders
                if min(_out_shape(SHAPES[nd], k, [s] * nd, [p] * nd, [d] * nd)) <= 0:
                    continue
                if kind == "deconv" and min((i - 1) * s - 2 * p + kk for i, kk in zip(SHAPES[nd], k)) <= 0:
                    continue
                yield nd, k, s, p, d, b


def _ids(case):
    nd, k, s, p, d, b = case
    return f"{nd}d-k{''.join(map(str, k))}-s{s}-p{p}-d{d}-b{b}"


def _make(kind, nd, k, s, p, d, bias=True, key=None, cin=CIN, cout=COUT):
    cls = {"subm": spconv.SubMConv1d, "conv": spconv.SparseConv1d, "deconv": spconv.SparseConvTranspose1d}[kind]
    cls = getattr(spconv, cls.__name__.replace("1d", f"{nd}d"))
    if kind == "subm":
        return cls(cin, cout, k, dilation=d, bias=bias, indice_key=key)
    return cls(cin, cout, k, s, p, d, bias=bias, indice_key=key)


def _reference(kind, x, weight, out, s, p, d):
    nd = len(x.spatial_shape)
    args = (kind, x, weight, out.indices, out.spatial_shape, [s] * nd, [p] * nd, [d] * nd)
    return brute_force(*args) if nd == 4 else dense_reference(*args)


def _effective_weight(layer):
    return conv1x1_weight(layer.weight) if layer.conv1x1 else layer.weight


def check_layer(kind, nd, k, s, p, d, b, seed=0, cin=CIN, cout=COUT):
    torch.manual_seed(seed)
    layer = _make(kind, nd, k, s, p, d, cin=cin, cout=cout)
    x = random_sparse(nd, SHAPES[nd], b, cin, density=0.3, seed=seed)
    x.features.requires_grad_(True)
    out = layer(x)
    grad = torch.randn_like(out.features)
    (out.features * grad).sum().backward()

    # The same computation in FP64 through the dense reference.
    x64 = spconv.SparseConvTensor(x.features.detach().double().requires_grad_(True), x.indices,
                                  x.spatial_shape, b)
    w64 = layer.weight.detach().double().requires_grad_(True)
    w_eff = conv1x1_weight(w64) if layer.conv1x1 else w64
    ref = _reference(kind, x64, w_eff, out, s, p, d) + layer.bias.detach().double()
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(out.features.double(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(x.features.grad.double(), x64.features.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(layer.weight.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(layer.bias.grad, grad.sum(0), atol=1e-4, rtol=1e-4)
    return out


@pytest.mark.parametrize("case", list(_cases("subm")), ids=_ids)
def test_subm(case):
    nd, k, s, p, d, b = case
    out = check_layer("subm", nd, k, s, p, d, b)
    assert out.spatial_shape == SHAPES[nd]


@pytest.mark.parametrize("case", list(_cases("conv")), ids=_ids)
def test_sparse_conv(case):
    nd, k, s, p, d, b = case
    out = check_layer("conv", nd, k, s, p, d, b)
    assert out.spatial_shape == _out_shape(SHAPES[nd], k, [s] * nd, [p] * nd, [d] * nd)


@pytest.mark.slow
@pytest.mark.parametrize("case", list(_cases("deconv")), ids=_ids)
def test_sparse_conv_transpose(case):
    nd, k, s, p, d, b = case
    check_layer("deconv", nd, k, s, p, d, b)


@pytest.mark.parametrize("case", list(_cases("conv")), ids=_ids)
def test_inverse_conv(case):
    """SparseConvNd with an indice_key, then SparseInverseConvNd restores the input sites."""
    nd, k, s, p, d, b = case
    if all(kk == 1 for kk in k) and s == 1:
        return  # a 1x1 stride-1 conv stores no kernel map (as in spconv); nothing to invert
    torch.manual_seed(1)
    down = _make("conv", nd, k, s, p, d, key="down")
    inv = getattr(spconv, f"SparseInverseConv{nd}d")(COUT, CIN, k, indice_key="down")
    x = random_sparse(nd, SHAPES[nd], b, CIN, seed=3)
    y = down(x)
    y = y.replace_feature(y.features.detach().requires_grad_(True))
    z = inv(y)
    assert torch.equal(z.indices, x.indices)
    assert z.spatial_shape == x.spatial_shape
    grad = torch.randn_like(z.features)
    (z.features * grad).sum().backward()

    y64 = spconv.SparseConvTensor(y.features.detach().double().requires_grad_(True), y.indices, y.spatial_shape, b)
    w64 = inv.weight.detach().double().requires_grad_(True)
    args = ("inverse", y64, w64, x.indices, x.spatial_shape, [s] * nd, [p] * nd, [d] * nd)
    ref = (brute_force(*args) if nd == 4 else dense_reference(*args)) + inv.bias.detach().double()
    (ref * grad.double()).sum().backward()
    torch.testing.assert_close(z.features.double(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(y.features.grad.double(), y64.features.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(inv.weight.grad.double(), w64.grad, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("kind", ["subm", "conv", "deconv"])
def test_brute_force_agrees_with_dense_3d(kind):
    """The two references agree, so the 4D brute force is trustworthy."""
    x = random_sparse(3, SHAPES[3], 2, CIN, seed=5).replace_feature(
        random_sparse(3, SHAPES[3], 2, CIN, seed=5).features.double())
    layer = _make(kind, 3, (3, 2, 3), 2 if kind != "subm" else 1, 1, 1).double()
    out = layer(x)
    s = 2 if kind != "subm" else 1
    a = dense_reference(kind, x, layer.weight.detach(), out.indices, out.spatial_shape, [s] * 3, [1] * 3, [1] * 3)
    b = brute_force(kind, x, layer.weight.detach(), out.indices, out.spatial_shape, [s] * 3, [1] * 3, [1] * 3)
    torch.testing.assert_close(a, b)


@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_wide_layer_with_large_weight_layouts(kind):
    """192 -> 224 channels, 3^3: a 4.6 MB weight, whose layout changes (filters, the dinput pass's transposed
    filters, the filter gradient back to spconv's layout) are written with streaming stores on x86 (from 4 MB):
    forward, dinput and dfilter against the dense FP64 reference."""
    s, p = (1, 0) if kind == "subm" else (2, 1)
    check_layer(kind, 3, (3, 3, 3), s, p, 1, 2, seed=2, cin=192, cout=224)
