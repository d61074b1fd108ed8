"""Property-based fuzzing: random dims (1-4), shapes, geometry, sparsity, batch sizes and dtypes; every conv kind
and pooling against a dense (1-3D) or brute-force (4D) reference; random bad inputs raise the documented type.

Default profile is short and derandomized (CI); `pytest test/test_fuzz.py --hypothesis-profile=long` digs deeper.
"""
import numpy as np
import pytest
import torch
import torch.nn.functional as F

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, strategies as st  # noqa: E402

import spconv.pytorch as spconv  # noqa: E402
from support.reference import (brute_force, conv1x1_weight, dense_reference, gather_sites, low_precision_ok,  # noqa: E402
                        random_sparse)

CONV = {
    "subm": [None, spconv.SubMConv1d, spconv.SubMConv2d, spconv.SubMConv3d, spconv.SubMConv4d],
    "conv": [None, spconv.SparseConv1d, spconv.SparseConv2d, spconv.SparseConv3d, spconv.SparseConv4d],
    "deconv": [None, spconv.SparseConvTranspose1d, spconv.SparseConvTranspose2d, spconv.SparseConvTranspose3d,
               spconv.SparseConvTranspose4d],
    "inverse": [None, spconv.SparseInverseConv1d, spconv.SparseInverseConv2d, spconv.SparseInverseConv3d,
                spconv.SparseInverseConv4d],
}
POOL = {"max": [None, spconv.SparseMaxPool1d, spconv.SparseMaxPool2d, spconv.SparseMaxPool3d],
        "avg": [None, spconv.SparseAvgPool1d, spconv.SparseAvgPool2d, spconv.SparseAvgPool3d]}


@st.composite
def geometry(draw, max_dim=4):
    nd = draw(st.integers(1, max_dim))
    top = {1: 12, 2: 7, 3: 5, 4: 4}[nd]
    per_dim = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=nd, max_size=nd)  # noqa: E731
    return dict(nd=nd, shape=draw(per_dim(1, top)), ksize=draw(per_dim(1, 3)), stride=draw(per_dim(1, 3)),
                padding=draw(per_dim(0, 2)), dilation=draw(per_dim(1, 2)), batch=draw(st.integers(1, 3)),
                density=draw(st.floats(0.0, 1.0)), cin=draw(st.integers(1, 5)), cout=draw(st.integers(1, 5)),
                seed=draw(st.integers(0, 2 ** 16)))


def _input(g, dtype=torch.float64):
    return random_sparse(g["nd"], g["shape"], g["batch"], g["cin"], density=g["density"], dtype=dtype,
                         seed=g["seed"], min_sites=0)


def _reference(kind, x, weight, y, stride, padding, dilation, kvol1):
    if kvol1:  # spconv 2.x reinterprets the weight of a kernel-volume-1 layer
        weight = conv1x1_weight(weight)
    if len(x.spatial_shape) <= 3:
        return dense_reference(kind, x, weight, y.indices, y.spatial_shape, stride, padding, dilation)
    return brute_force(kind, x, weight, y.indices, y.spatial_shape, stride, padding, dilation)


def _expected_output_shape(kind, g):
    if kind == "subm":
        return list(g["shape"])
    if kind == "deconv":
        return [(i - 1) * s - 2 * p + k for i, k, s, p in zip(g["shape"], g["ksize"], g["stride"], g["padding"])]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(g["shape"], g["ksize"], g["stride"], g["padding"], g["dilation"])]


def _build(kind, g, **kw):
    nd = g["nd"]
    stride = [1] * nd if kind == "subm" else g["stride"]
    padding = [0] * nd if kind == "subm" else g["padding"]
    return CONV[kind][nd](g["cin"], g["cout"], g["ksize"], stride, padding, g["dilation"], bias=False, **kw)


@given(g=geometry(), kind=st.sampled_from(["subm", "conv", "deconv"]))
def test_conv_matches_reference(g, kind):
    nd = g["nd"]
    kvol1 = int(np.prod(g["ksize"])) == 1 and (kind == "subm" or int(np.prod(g["stride"])) == 1)
    if kvol1 and kind != "subm" and any(g["padding"]):
        with pytest.raises(ValueError, match="padding must be zero"):
            _build(kind, g)
        return
    out_shape = _expected_output_shape(kind, g)
    x = _input(g)
    torch.manual_seed(g["seed"])
    layer = _build(kind, g).double()
    if min(out_shape) <= 0 and not kvol1:
        with pytest.raises(ValueError, match="output shape"):
            layer(x)
        return
    y = layer(x)
    assert y.spatial_shape == (list(g["shape"]) if kvol1 else out_shape)
    if kind == "subm" or kvol1:
        assert torch.equal(y.indices, x.indices)  # rows keep their order
    stride = [1] * nd if kind == "subm" else g["stride"]
    padding = [0] * nd if kind == "subm" else g["padding"]
    ref = _reference(kind, x, layer.weight.detach(), y, stride, padding, g["dilation"], kvol1)
    torch.testing.assert_close(y.features, ref, atol=1e-10, rtol=1e-10)
    # Output sites: exactly the ones some input reaches (checked by the reference for non-subm kinds), unique.
    assert torch.unique(y.indices, dim=0).shape[0] == y.indices.shape[0]
    # Backward against autograd through the reference.
    feats = x.features.clone().requires_grad_()
    w = layer.weight.detach().clone().requires_grad_()
    xr = x.replace_feature(feats)
    g_out = torch.randn_like(ref)
    (_reference(kind, xr, w, y, stride, padding, g["dilation"], kvol1) * g_out).sum().backward()
    layer.zero_grad()
    feats2 = x.features.clone().requires_grad_()
    (layer(x.replace_feature(feats2)).features * g_out).sum().backward()
    torch.testing.assert_close(feats2.grad, feats.grad, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(layer.weight.grad, w.grad, atol=1e-9, rtol=1e-9)


@given(g=geometry())
def test_inverse_conv_matches_reference(g):
    nd = g["nd"]
    assume(int(np.prod(g["ksize"])) > 1 or int(np.prod(g["stride"])) > 1)  # else the conv stores no map
    assume(min(_expected_output_shape("conv", g)) > 0)
    x = _input(g)
    torch.manual_seed(g["seed"])
    down = CONV["conv"][nd](g["cin"], g["cout"], g["ksize"], g["stride"], g["padding"], g["dilation"],
                            indice_key="k").double()
    up = CONV["inverse"][nd](g["cout"], g["cin"], g["ksize"], indice_key="k", bias=False).double()
    y = down(x)
    z = up(y)
    assert torch.equal(z.indices, x.indices) and z.spatial_shape == x.spatial_shape
    weight = up.weight.detach()  # an inverse conv reads [Cout, *k, Cin] normally, even at kernel volume 1
    # Brute force: the dense transposed conv can't take every padding the sparse layer can.
    ref = brute_force("inverse", y, weight, x.indices, x.spatial_shape, g["stride"], g["padding"], g["dilation"])
    torch.testing.assert_close(z.features, ref, atol=1e-10, rtol=1e-10)


def _pool_reference(kind, x, y, ksize, stride, padding, dilation):
    nd = len(ksize)
    dense = x.dense()
    mask = torch.zeros((x.batch_size, 1) + tuple(x.spatial_shape), dtype=dense.dtype)
    mask[(x.indices[:, 0].long(), 0) + tuple(x.indices[:, 1:].long().t())] = 1
    conv = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}[nd]
    if kind == "avg":
        c = dense.shape[1]
        ones = torch.ones((c, 1) + tuple(ksize), dtype=dense.dtype)
        total = conv(dense, ones, None, stride, padding, dilation, groups=c)
        count = conv(mask, ones[:1], None, stride, padding, dilation)
        out = total / count.clamp(min=1)
    else:  # max(0, max over active inputs): inactive sites hold -inf, then clamp at 0
        pool = {1: F.max_pool1d, 2: F.max_pool2d, 3: F.max_pool3d}[nd]
        neg = dense.masked_fill(mask == 0, float("-inf"))
        out = pool(neg, ksize, stride, padding, dilation).clamp(min=0)
    return gather_sites(out, y.indices)


@given(g=geometry(max_dim=3), kind=st.sampled_from(["max", "avg"]))
def test_pool_matches_reference(g, kind):
    nd = g["nd"]
    # torch's max pool needs padding <= kernel_size // 2; the sparse pool doesn't, but the reference does.
    assume(all(p <= k // 2 for p, k in zip(g["padding"], g["ksize"])))
    assume(min(_expected_output_shape("conv", g)) > 0)
    x = _input(g)
    pool = POOL[kind][nd](g["ksize"], g["stride"], g["padding"], g["dilation"])
    y = pool(x)
    ref = _pool_reference(kind, x, y, g["ksize"], g["stride"], g["padding"], g["dilation"])
    torch.testing.assert_close(y.features, ref, atol=1e-10, rtol=1e-10)


@given(g=geometry(max_dim=3), kind=st.sampled_from(["subm", "conv", "deconv"]),
       dtype=st.sampled_from([torch.float32, torch.float16, torch.bfloat16]))
def test_low_precision_against_fp32(g, kind, dtype):
    kvol1 = int(np.prod(g["ksize"])) == 1 and (kind == "subm" or int(np.prod(g["stride"])) == 1)
    assume(not kvol1 or kind == "subm" or not any(g["padding"]))
    assume(min(_expected_output_shape(kind, g)) > 0)
    x = _input(g, torch.float32)
    torch.manual_seed(g["seed"])
    layer = _build(kind, g)
    ref = layer(x).features
    y = layer.to(dtype)(x.replace_feature(x.features.to(dtype)))
    assert y.features.dtype == dtype
    if dtype == torch.float32:
        torch.testing.assert_close(y.features, ref, atol=1e-4, rtol=1e-4)
    else:
        assert low_precision_ok(y.features.float() - ref, g["cin"], g["cout"])


# ---- random bad inputs raise the documented exception type ----

BAD = ["batch_high", "batch_negative", "coord_negative", "coord_high", "int64_indices", "rows_mismatch",
       "shape_length", "channels", "subm_duplicate", "kernel_length", "stride_zero", "dtype_mismatch"]


@given(g=geometry(max_dim=4), bad=st.sampled_from(BAD), data=st.data())
def test_random_bad_input_raises_documented_type(g, bad, data):
    nd = g["nd"]
    g = dict(g, density=max(g["density"], 0.3))
    x = _input(g, torch.float32)
    assume(x.indices.shape[0] >= 2)
    idx, feats, shape, batch = x.indices.clone(), x.features, list(g["shape"]), g["batch"]
    row = data.draw(st.integers(0, idx.shape[0] - 1))
    col = data.draw(st.integers(1, nd))
    cin, kwargs = g["cin"], {}
    expected = ValueError
    if bad == "batch_high":
        idx[row, 0] = batch + data.draw(st.integers(0, 100))
    elif bad == "batch_negative":
        idx[row, 0] = -data.draw(st.integers(1, 100))
    elif bad == "coord_negative":
        idx[row, col] = -data.draw(st.integers(1, 2 ** 31 - 1))
    elif bad == "coord_high":
        idx[row, col] = shape[col - 1] + data.draw(st.integers(0, 2 ** 31 - 1 - shape[col - 1]))
    elif bad == "int64_indices":
        idx, expected = idx.long(), TypeError
    elif bad == "rows_mismatch":
        feats = feats[:-1]
    elif bad == "shape_length":
        shape = shape + [3] if nd < 4 else shape[:-1]
    elif bad == "channels":
        cin += 1
    elif bad == "subm_duplicate":
        other = data.draw(st.integers(0, idx.shape[0] - 1).filter(lambda r: r != row))
        idx[other] = idx[row]
    elif bad == "kernel_length":
        kwargs["kernel_size"] = [3] * (nd + 1)
    elif bad == "stride_zero":
        kwargs["stride"] = [0] * nd
    elif bad == "dtype_mismatch":
        feats, expected = feats.double(), TypeError
    with pytest.raises(expected):
        t = spconv.SparseConvTensor(feats, idx, shape, batch)
        CONV["subm"][nd](cin, 2, kwargs.get("kernel_size", 3), kwargs.get("stride", 1))(t)
