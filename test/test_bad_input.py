"""Bad input raises a Python exception that names the argument; it never crashes or gives wrong numbers.

Each case asserts the exception type and a fragment of the message (the table in docs/RELIABILITY.md lists them). Non-contiguous inputs and NaN/Inf features are not errors: they must give the right answer.
"""
import pytest
import torch
import torch.nn.functional as F

import spconv
import spconv.pytorch as spconv_pt
from support.reference import dense_reference, random_sparse

SHAPE = [6, 5, 4]


def _tensor(n_ch=3, seed=0, batch_size=2):
    return random_sparse(3, SHAPE, batch_size, n_ch, density=0.2, seed=seed)


def _with_indices(x, indices, batch_size=None):
    return spconv_pt.SparseConvTensor(x.features, indices, x.spatial_shape,
                                      x.batch_size if batch_size is None else batch_size)


# ---- SparseConvTensor construction ----

@pytest.mark.parametrize("make, exc, words", [
    (lambda x: (x.features, x.indices.long(), SHAPE, 2), TypeError, ["indices", "int32"]),
    (lambda x: (x.features, x.indices.float(), SHAPE, 2), TypeError, ["indices", "int32"]),
    (lambda x: (x.features, x.indices.reshape(-1), SHAPE, 2), ValueError, ["indices", "2-D"]),
    (lambda x: (x.features.reshape(-1), x.indices, SHAPE, 2), ValueError, ["features", "2-D"]),
    (lambda x: (x.features, x.indices, SHAPE[:2], 2), ValueError, ["spatial_shape"]),
    (lambda x: (x.features, x.indices, SHAPE + [3], 2), ValueError, ["spatial_shape"]),
    (lambda x: (x.features, x.indices, SHAPE, 0), ValueError, ["batch_size"]),
])
def test_tensor_construction(make, exc, words):
    with pytest.raises(exc) as info:
        spconv_pt.SparseConvTensor(*make(_tensor()))
    for w in words:
        assert w in str(info.value), (w, str(info.value))


# ---- consistency, checked where the tensor is consumed (spconv 2.x constructs anything row-wise) ----

def _fewer_feature_rows(x):
    return x.replace_feature(x.features[:-1])


def _indices_assigned_later(x):
    x.indices = torch.cat([x.indices, x.indices[:2]])  # replace_feature's partner statement never came
    return x


def _indices_int64(x):
    x.indices = x.indices.long()
    return x


def _features_on_meta(x):
    return x.replace_feature(x.features.to("meta"))


CONSUMERS = {
    "subm": lambda x: spconv_pt.SubMConv3d(3, 4, 3)(x),
    "conv": lambda x: spconv_pt.SparseConv3d(3, 4, 3, 2, 1)(x),
    "conv1x1": lambda x: spconv_pt.SubMConv3d(3, 4, 1)(x),
    "maxpool": lambda x: spconv_pt.SparseMaxPool3d(2, 2)(x),
    "global_pool": lambda x: spconv_pt.SparseGlobalMaxPool()(x),
    "dense": lambda x: x.dense(),
    "dense_channels_last": lambda x: x.dense(channels_first=False),
    "to_dense": lambda x: spconv_pt.ToDense()(x),
    "sparse_add": lambda x: spconv_pt.functional.sparse_add(x, x),
    "add_table": lambda x: spconv_pt.AddTable()([x, x]),
    "join_table": lambda x: spconv_pt.JoinTable()([x, x]),
    "remove_duplicate": lambda x: spconv_pt.RemoveDuplicate()(x),
}


@pytest.mark.parametrize("consumer", sorted(CONSUMERS))
@pytest.mark.parametrize("fault, exc, words", [
    (_fewer_feature_rows, ValueError, ["features and indices", "rows", "expected {n}, got {n_minus_1}"]),
    (_indices_assigned_later, ValueError, ["features and indices", "rows", "expected {n_plus_2}, got {n}"]),
    (_indices_int64, TypeError, ["indices", "int32"]),
    (_features_on_meta, ValueError, ["features", "indices", "meta"]),
])
def test_inconsistent_tensor_fails_where_consumed(consumer, fault, exc, words):
    n = _tensor().indices.shape[0]
    x = fault(_tensor())  # building it is allowed, as in spconv 2.x
    with pytest.raises(exc) as info:
        CONSUMERS[consumer](x)
    for w in words:
        w = w.format(n=n, n_minus_1=n - 1, n_plus_2=n + 2)
        assert w in str(info.value), (w, str(info.value))


def test_features_and_indices_replaced_in_two_statements():
    """VoxelNeXt's pattern: features of two tensors concatenated by replace_feature, the indices assigned on the
    next statement after in-place arithmetic on one of them; the layers that consume the result see it whole."""
    a = random_sparse(3, SHAPE, 1, 3, density=0.2, seed=1)
    b = random_sparse(3, SHAPE, 1, 3, density=0.2, seed=2)
    b.indices[:, 0] += 1  # in place: b becomes batch entry 1
    x = a.replace_feature(torch.cat([a.features, b.features]))
    x.indices = torch.cat([a.indices, b.indices])
    x.batch_size = 2
    whole = spconv_pt.SparseConvTensor(x.features.clone(), x.indices.clone(), SHAPE, 2)
    conv = spconv_pt.SubMConv3d(3, 4, 3, bias=False)
    torch.testing.assert_close(conv(x).dense(), conv(whole).dense())
    ref = F.conv3d(whole.dense(), conv.weight.permute(0, 4, 1, 2, 3), padding=1)
    torch.testing.assert_close(conv(x).dense(), ref * (whole.dense().abs().sum(1, keepdim=True) > 0),
                               atol=1e-5, rtol=1e-5)
    # sites merged by torch.unique(return_inverse=True), as the clients' BEV heads do
    x.indices[:, 1] = 0
    uniq, inverse = torch.unique(x.indices, dim=0, return_inverse=True)
    feats = x.features.new_zeros(len(uniq), 3).index_add_(0, inverse, x.features)
    bev = x.replace_feature(feats)
    bev.indices = uniq.int()
    torch.testing.assert_close(bev.dense().sum(2), whole.dense().sum(2))


def test_in_place_index_edits_between_layers_are_seen():
    """Nothing cached on a tensor hides an in-place edit of its indices: the next layer builds its map from the
    edited coordinates (a map stored under an indice_key stays the user's responsibility, as in spconv 2.x)."""
    x = _tensor()
    conv = spconv_pt.SparseConv3d(3, 4, 2, 2, bias=False)
    before = conv(x).dense()
    x.indices[:, 1:] = torch.tensor(SHAPE, dtype=torch.int32) - 1 - x.indices[:, 1:]  # mirror each axis
    fresh = spconv_pt.SparseConvTensor(x.features, x.indices.clone(), SHAPE, 2)
    after = conv(x).dense()
    torch.testing.assert_close(after, conv(fresh).dense())
    assert not torch.equal(after, before)


# ---- coordinates, checked when a layer builds its kernel map ----

LAYERS = {
    "subm": lambda: spconv_pt.SubMConv3d(3, 4, 3),
    "conv": lambda: spconv_pt.SparseConv3d(3, 4, 3, 2, 1),
    "deconv": lambda: spconv_pt.SparseConvTranspose3d(3, 4, 3, 2),
    "maxpool": lambda: spconv_pt.SparseMaxPool3d(2, 2),
}


@pytest.mark.parametrize("layer", sorted(LAYERS))
@pytest.mark.parametrize("column, value, words", [
    (1, -1, ["indices row", "spatial_shape"]),
    (2, SHAPE[1], ["indices row", "spatial_shape"]),
    (3, 1 << 30, ["indices row", "spatial_shape"]),
    (0, 2, ["batch index", "batch_size=2"]),
    (0, -1, ["batch index", "batch_size=2"]),
])
def test_coordinates_outside_grid(layer, column, value, words):
    x = _tensor()
    bad = x.indices.clone()
    bad[3, column] = value
    with pytest.raises(ValueError) as info:
        LAYERS[layer]()(_with_indices(x, bad))
    msg = str(info.value)
    for w in words:
        assert w in msg, (w, msg)
    assert "row 3" in msg


def test_dense_rejects_coordinates_outside_grid():
    # dense() must not wrap a bad coordinate into a neighbouring row or batch (silent wrong numbers).
    x = _tensor()
    for column, value in ((1, -1), (2, SHAPE[1]), (0, 2)):
        bad = x.indices.clone()
        bad[0, column] = value
        with pytest.raises(ValueError, match="indices"):
            _with_indices(x, bad).dense()


def test_duplicates_rejected_by_subm():
    x = _tensor()
    dup = x.indices.clone()
    dup[5] = dup[2]
    with pytest.raises(ValueError, match=r"indices row 5 .*unique coordinates"):
        spconv_pt.SubMConv3d(3, 4, 3)(_with_indices(x, dup))


def test_duplicates_in_regular_conv_opt_in(monkeypatch):
    x = _tensor()
    dup = x.indices.clone()
    dup[5] = dup[2]
    conv = spconv_pt.SparseConv3d(3, 4, 3, 2, 1)
    # Default (unchecked): duplicates act like one site holding the sum of their features.
    monkeypatch.setattr(spconv.constants, "SPCONV_CHECK_DUPLICATES", False)
    y = conv(_with_indices(x, dup))
    merged = x.features.clone()
    merged[2] += merged[5]
    keep = torch.arange(x.indices.shape[0]) != 5
    ref = conv(spconv_pt.SparseConvTensor(merged[keep], x.indices[keep], SHAPE, 2))
    torch.testing.assert_close(y.dense(), ref.dense(), atol=1e-5, rtol=1e-5)
    # Opt-in check: a clear error naming the rows.
    monkeypatch.setattr(spconv.constants, "SPCONV_CHECK_DUPLICATES", True)
    with pytest.raises(ValueError, match=r"indices rows 2 and 5 .*same coordinate"):
        conv(_with_indices(x, dup))
    conv(x)  # unique coordinates pass the check


# ---- layer arguments ----

@pytest.mark.parametrize("kwargs, words", [
    (dict(kernel_size=[3, 3]), ["kernel_size", "3 entries"]),
    (dict(kernel_size=[3, 3, 3, 3]), ["kernel_size", "3 entries"]),
    (dict(kernel_size=0), ["kernel_size", ">= 1"]),
    (dict(kernel_size=[3, -1, 3]), ["kernel_size", ">= 1"]),
    (dict(stride=[1, 2]), ["stride", "3 entries"]),
    (dict(stride=0), ["stride", ">= 1"]),
    (dict(padding=[0, 0]), ["padding", "3 entries"]),
    (dict(padding=-1), ["padding", ">= 0"]),
    (dict(dilation=(1, 1, 1, 1)), ["dilation", "3 entries"]),
    (dict(dilation=0), ["dilation", ">= 1"]),
])
@pytest.mark.parametrize("cls", [spconv_pt.SparseConv3d, spconv_pt.SubMConv3d, spconv_pt.SparseConvTranspose3d])
def test_bad_geometry_arguments(cls, kwargs, words):
    kwargs = dict(dict(kernel_size=3), **kwargs)
    with pytest.raises(ValueError) as info:
        cls(3, 4, **kwargs)
    for w in words:
        assert w in str(info.value), (w, str(info.value))


@pytest.mark.parametrize("kwargs, words", [
    (dict(kernel_size=[2, 2]), ["kernel_size", "3 entries"]),
    (dict(kernel_size=0), ["kernel_size", ">= 1"]),
    (dict(kernel_size=2, stride=0), ["stride", ">= 1"]),
    (dict(kernel_size=2, padding=-1), ["padding", ">= 0"]),
])
def test_bad_pool_arguments(kwargs, words):
    with pytest.raises(ValueError) as info:
        spconv_pt.SparseMaxPool3d(**kwargs)
    for w in words:
        assert w in str(info.value)


def test_bad_channels():
    with pytest.raises(ValueError, match="in_channels and out_channels"):
        spconv_pt.SubMConv3d(0, 4, 3)
    with pytest.raises(ValueError, match="channel size mismatch.*expects 5 input channels.*have 3"):
        spconv_pt.SubMConv3d(5, 4, 3)(_tensor())
    with pytest.raises(ValueError, match="channel size mismatch"):
        spconv_pt.SubMConv3d(5, 4, 1)(_tensor())  # the kernel-volume-1 route checks too


def test_wrong_dimensionality_and_input_type():
    with pytest.raises(ValueError, match="2-D but the input's spatial_shape"):
        spconv_pt.SubMConv2d(3, 4, 3)(_tensor())
    with pytest.raises(TypeError, match="expects a SparseConvTensor"):
        spconv_pt.SubMConv3d(3, 4, 3)(torch.zeros(4, 3))
    with pytest.raises(TypeError, match="features dtype torch.float64 differs from the weight dtype"):
        spconv_pt.SubMConv3d(3, 4, 3)(_tensor().replace_feature(torch.zeros(_tensor().features.shape,
                                                                             dtype=torch.float64)))


def test_too_small_spatial_shape():
    x = random_sparse(3, [2, 2, 2], 1, 3, density=0.5)
    with pytest.raises(ValueError, match="spatial_shape .* too small"):
        spconv_pt.SparseConv3d(3, 4, 5)(x)


# ---- indice_key misuse ----

def test_indice_key_reused_with_other_kernel():
    x = _tensor()
    y = spconv_pt.SubMConv3d(3, 4, 3, indice_key="k")(x)
    with pytest.raises(ValueError, match="indice_key 'k' must have the same kernel_size"):
        spconv_pt.SubMConv3d(4, 4, 5, indice_key="k")(y)
    with pytest.raises(ValueError, match="indice_key 'k' must have the same dilation"):
        spconv_pt.SubMConv3d(4, 4, 3, dilation=2, indice_key="k")(y)


def test_indice_key_reused_at_other_resolution():
    x = _tensor()
    y = spconv_pt.SubMConv3d(3, 4, 3, indice_key="k")(x)
    z = spconv_pt.SparseConv3d(4, 4, 2, 2)(y)  # new resolution, same indice_dict
    with pytest.raises(ValueError, match="indice_key 'k' must see the same spatial_shape"):
        spconv_pt.SubMConv3d(4, 4, 3, indice_key="k")(z)
    with pytest.raises(ValueError, match="indice_key 'k' already exists"):
        spconv_pt.SparseConv3d(4, 4, 3, indice_key="k")(y)


def test_inverse_conv_without_stored_pairs():
    x = _tensor()
    with pytest.raises(ValueError, match="no kernel map stored under indice_key 'down'"):
        spconv_pt.SparseInverseConv3d(3, 4, 3, indice_key="down")(x)
    y = spconv_pt.SubMConv3d(3, 3, 3, indice_key="subm")(x)
    with pytest.raises(ValueError, match="indice_key 'subm' holds a submanifold"):
        spconv_pt.SparseInverseConv3d(3, 4, 3, indice_key="subm")(y)
    z = spconv_pt.SparseConv3d(3, 3, 3, 2, 1, indice_key="down")(x)
    with pytest.raises(ValueError, match="must have the kernel_size of the conv it inverts"):
        spconv_pt.SparseInverseConv3d(3, 4, 2, indice_key="down")(z)
    wrong_level = spconv_pt.SparseConvTensor(x.features, x.indices, SHAPE, 2, indice_dict=z.indice_dict)
    with pytest.raises(ValueError, match="expects spatial_shape"):
        spconv_pt.SparseInverseConv3d(3, 4, 3, indice_key="down")(wrong_level)


# ---- not errors: non-contiguous inputs, NaN / Inf ----

@pytest.mark.parametrize("layer", sorted(LAYERS))
def test_non_contiguous_inputs_read_correctly(layer):
    x = _tensor(seed=3)
    torch.manual_seed(0)
    mod = LAYERS[layer]()
    ref = mod(x)
    # Features as a column slice of a wider tensor, indices as a transposed copy and a column slice.
    wide = torch.randn(x.features.shape[0], 7)
    wide[:, 2:5] = x.features
    feats = wide[:, 2:5]
    idx_t = x.indices.t().contiguous().t()
    idx_wide = torch.zeros(x.indices.shape[0], 6, dtype=torch.int32)
    idx_wide[:, 1:5] = x.indices
    for idx in (idx_t, idx_wide[:, 1:5]):
        assert not feats.is_contiguous() and not idx.is_contiguous()
        y = mod(spconv_pt.SparseConvTensor(feats, idx, SHAPE, 2))
        assert torch.equal(y.indices, ref.indices)
        assert torch.equal(y.features, ref.features)
    # Non-contiguous gradients flowing back too.
    feats = feats.detach().requires_grad_()
    y = mod(spconv_pt.SparseConvTensor(feats, idx_t, SHAPE, 2))
    y.features.t().sum().backward()
    assert feats.grad is not None and torch.isfinite(feats.grad).all()


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_nan_inf_propagate_like_dense(value):
    x = random_sparse(3, SHAPE, 1, 3, density=0.3, seed=4)
    feats = x.features.clone()
    feats[0, 1] = value
    x = x.replace_feature(feats)
    torch.manual_seed(0)
    for kind, mod in (("subm", spconv_pt.SubMConv3d(3, 2, 3, bias=False)),
                      ("conv", spconv_pt.SparseConv3d(3, 2, 3, 2, 1, bias=False))):
        y = mod(x)
        ref = dense_reference(kind, x, mod.weight.detach(), y.indices, y.spatial_shape, mod.stride, mod.padding,
                              mod.dilation)
        bad_ref = ~torch.isfinite(ref)
        assert bad_ref.any()
        # Dense convs turn the non-finite input into NaN/Inf at exactly the outputs it reaches.
        assert torch.equal(~torch.isfinite(y.features), bad_ref)
        assert torch.equal(torch.isnan(y.features), torch.isnan(ref))
        fin = ~bad_ref
        torch.testing.assert_close(y.features[fin], ref[fin], atol=1e-4, rtol=1e-4)


def _good_map():
    x = random_sparse(3, [6, 6, 6], 1, 4, density=0.3, seed=3)
    _, pin, pout, poff, _, _ = torch.ops.spconv.get_indice_pairs(x.indices, 1, [6, 6, 6], [6, 6, 6], [3, 3, 3],
                                                           [1, 1, 1], [1, 1, 1], [1, 1, 1], True, False)
    return x.features, pin, pout, poff


def _corrupt(what):
    feats, pin, pout, poff = _good_map()
    n = feats.shape[0]
    pin, pout, poff = pin.clone(), pout.clone(), poff.clone()
    if what == "pair_in high":
        pin[5] = n
    elif what == "pair_in negative":
        pin[0] = -1
    elif what == "pair_out high":
        pout[-1] = n + 7
    elif what == "offsets end":
        poff[-1] -= 1
    elif what == "offsets decrease":
        a, b = int(poff[3]), int(poff[4])
        poff[3], poff[4] = b + 1, a
    return feats, pin, pout, poff


_CORRUPTIONS = {"pair_in high": "pair_in holds rows outside", "pair_in negative": "pair_in holds rows outside",
                "pair_out high": "pair_out holds rows outside", "offsets end": "pair_offsets must start at 0",
                "offsets decrease": "pair_offsets must"}


@pytest.mark.parametrize("what", list(_CORRUPTIONS))
@pytest.mark.parametrize("op", ["conv", "conv_backward", "maxpool", "maxpool_backward", "avgpool", "avgpool_backward",
                                "fused_dfilter"])
def test_corrupt_kernel_maps_rejected_by_ops(op, what):
    # Kernel maps handed straight to the ops (spconv 2.x code calls ops directly): rows or offsets that would
    # read or write outside the tensors raise instead.
    feats, pin, pout, poff = _corrupt(what)
    n, ops = feats.shape[0], torch.ops.spconv
    w = torch.randn(27, 4, 5)
    calls = {
        "conv": lambda: ops.indice_conv(feats, w, pin, pout, poff, n),
        "conv_backward": lambda: ops.indice_conv_backward(feats, w, torch.randn(n, 5), pin, pout, poff),
        "maxpool": lambda: ops.indice_maxpool(feats, pin, pout, poff, n),
        "maxpool_backward": lambda: ops.indice_maxpool_backward(feats, feats, feats, pin, pout, poff),
        "avgpool": lambda: ops.indice_avgpool(feats, pin, pout, poff, n),
        "avgpool_backward": lambda: ops.indice_avgpool_backward(feats, torch.ones(n, dtype=torch.int32), pin, pout,
                                                                 poff, n),
        "fused_dfilter": lambda: ops.fused_conv_dfilter(feats, torch.randn(n, 5), pin, pout, poff),
    }
    with pytest.raises(ValueError, match=_CORRUPTIONS[what]):
        calls[op]()
