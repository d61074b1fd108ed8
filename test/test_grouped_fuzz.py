"""Property-based fuzzing of grouped convolution: random dimension (1-4), shapes, geometry, sparsity, batch
sizes, groups and channels per group; every conv kind against the dense grouped (1-3D) or per-group brute-force
(4D) reference in FP64, forward and both gradients; random bad groups raise ValueError naming the channels."""
import numpy as np
import pytest
import torch

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import assume, given, strategies as st  # noqa: E402

import spconv.pytorch as spconv  # noqa: E402
from support.grouped_reference import grouped_reference  # noqa: E402
from support.reference import random_sparse  # noqa: E402

CONV = {"subm": "SubMConv{}d", "conv": "SparseConv{}d", "deconv": "SparseConvTranspose{}d"}


@st.composite
def geometry(draw):
    nd = draw(st.integers(1, 4))
    top = {1: 12, 2: 7, 3: 5, 4: 4}[nd]
    per_dim = lambda lo, hi: st.lists(st.integers(lo, hi), min_size=nd, max_size=nd)  # noqa: E731
    groups = draw(st.sampled_from([2, 3, 4, 8]))
    return dict(nd=nd, shape=draw(per_dim(1, top)), ksize=draw(per_dim(1, 3)), stride=draw(per_dim(1, 2)),
                padding=draw(per_dim(0, 1)), dilation=draw(per_dim(1, 2)), batch=draw(st.integers(1, 2)),
                density=draw(st.floats(0.0, 1.0)), groups=groups, cig=draw(st.integers(1, 3)),
                cog=draw(st.integers(1, 3)), seed=draw(st.integers(0, 2 ** 16)))


def _out_shape(kind, g):
    if kind == "subm":
        return list(g["shape"])
    if kind == "deconv":
        return [(i - 1) * s - 2 * p + k for i, k, s, p in zip(g["shape"], g["ksize"], g["stride"], g["padding"])]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(g["shape"], g["ksize"], g["stride"], g["padding"], g["dilation"])]


@given(g=geometry(), kind=st.sampled_from(["subm", "conv", "deconv"]))
def test_grouped_conv_matches_reference(g, kind):
    nd, groups = g["nd"], g["groups"]
    cin, cout = groups * g["cig"], groups * g["cog"]
    stride = [1] * nd if kind == "subm" else g["stride"]
    padding = [0] * nd if kind == "subm" else g["padding"]
    kvol1 = int(np.prod(g["ksize"])) == 1 and (kind == "subm" or int(np.prod(stride)) == 1)
    assume(not (kvol1 and any(padding)))
    assume(min(_out_shape(kind, g)) > 0 or kvol1)
    cls = getattr(spconv, CONV[kind].format(nd))
    torch.manual_seed(g["seed"])
    layer = cls(cin, cout, g["ksize"], stride, padding, g["dilation"], groups=groups, bias=False).double()
    x = random_sparse(nd, g["shape"], g["batch"], cin, density=g["density"], dtype=torch.float64, seed=g["seed"],
                      min_sites=0)
    feats = x.features.clone().requires_grad_()
    y = layer(x.replace_feature(feats))
    kind_ref = "subm" if kvol1 else kind
    w = layer.weight.detach().clone().requires_grad_()
    xr = x.replace_feature(x.features.clone().requires_grad_())
    ref = grouped_reference(kind_ref, xr, w, groups, y.indices, y.spatial_shape, stride, padding, g["dilation"])
    torch.testing.assert_close(y.features, ref, atol=1e-10, rtol=1e-10)
    g_out = torch.randn_like(ref)
    (ref * g_out).sum().backward()
    (y.features * g_out).sum().backward()
    torch.testing.assert_close(feats.grad, xr.features.grad, atol=1e-9, rtol=1e-9)
    torch.testing.assert_close(layer.weight.grad, w.grad, atol=1e-9, rtol=1e-9)


@given(cin=st.integers(1, 40), cout=st.integers(1, 40), groups=st.integers(2, 12))
def test_bad_groups_raise(cin, cout, groups):
    if cin % groups == 0 and cout % groups == 0:
        assert spconv.SubMConv2d(cin, cout, 3, groups=groups).weight.shape[-1] == cin // groups
        return
    with pytest.raises(ValueError, match=rf"in_channels \({cin}\) and out_channels \({cout}\)"):
        spconv.SubMConv2d(cin, cout, 3, groups=groups)
