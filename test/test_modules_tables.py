"""Containers, feature-wise modules, tables, sparse_add and the spconv 2.x ops/functional entry points."""
from collections import OrderedDict

import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from spconv.core import ConvAlgo
from spconv.pytorch import functional as Fsp
from spconv.pytorch import ops
from support.surface import gather_sites, make_sparse, with_features


def _subm(cin, cout, key="s1"):
    return spconv.SubMConv3d(cin, cout, 3, padding=1, bias=False, indice_key=key)


# ---- SparseSequential and feature-wise modules ----

def test_sequential_with_batchnorm_relu_matches_manual():
    torch.manual_seed(0)
    x = make_sparse([6, 6, 6], 2, 3, n=60)
    net = spconv.SparseSequential(_subm(3, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.0), _subm(8, 4))
    net.train()
    f = x.features.clone().requires_grad_(True)
    out = net(with_features(x, f))
    bn, c0, c4 = net[1], net[0], net[4]
    ref_bn = nn.BatchNorm1d(8)
    ref_bn.load_state_dict({k: v for k, v in bn.state_dict().items()})
    ref_bn.running_mean.zero_(), ref_bn.running_var.fill_(1), ref_bn.num_batches_tracked.zero_()
    f2 = x.features.clone().requires_grad_(True)
    h = c0(with_features(x, f2))
    h = h.replace_feature(torch.relu(ref_bn(h.features)))
    ref = c4(h)
    torch.testing.assert_close(out.features, ref.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(bn.running_mean, ref_bn.running_mean)
    out.features.sum().backward()
    ref.features.sum().backward()
    torch.testing.assert_close(f.grad, f2.grad, atol=1e-5, rtol=1e-5)
    # BatchNorm sees only the active rows: its batch statistics are those of the conv output's features.
    h0 = c0(x).features.detach()
    torch.testing.assert_close(bn.running_mean, 0.1 * h0.mean(0), atol=1e-5, rtol=1e-5)


def test_sequential_construction_and_indexing():
    a, b, c = _subm(2, 3), nn.ReLU(), _subm(3, 2)
    named = spconv.SparseSequential(OrderedDict([("conv", a), ("act", b)]))
    assert list(dict(named.named_children())) == ["conv", "act"]
    kw = spconv.SparseSequential(conv=a, act=b)
    assert kw.conv is a and len(kw) == 2
    seq = spconv.SparseSequential(a, b)
    seq.add(c)
    assert len(seq) == 3 and seq[-1] is c and seq[0] is a
    assert isinstance(seq[1:], spconv.SparseSequential) and len(seq[1:]) == 2
    with pytest.raises(IndexError):
        seq[3]


def test_sequential_skips_dense_modules_for_empty_tensor():
    bn = nn.BatchNorm1d(3)
    net = spconv.SparseSequential(bn, nn.ReLU())
    x = spconv.SparseConvTensor(torch.zeros(0, 3), torch.zeros(0, 4, dtype=torch.int32), [4, 4, 4], 1)
    y = net(x)
    assert y.features.shape == (0, 3)
    assert int(bn.num_batches_tracked) == 0


def test_sparse_feature_wise_modules():
    x = make_sparse([5, 5], 1, 4, n=10, seed=2)
    bn = spconv.SparseBatchNorm(4).eval()
    bn.running_mean.fill_(0.5)
    assert torch.allclose(bn(x).features, (x.features - 0.5) / torch.sqrt(torch.tensor(1 + 1e-5)))
    assert torch.equal(spconv.SparseReLU()(x).features, torch.relu(x.features))
    assert torch.equal(spconv.SparseIdentity()(x).features, x.features)
    assert torch.equal(spconv.SparseReLU()(x.features), torch.relu(x.features))  # dense input too
    empty = spconv.SparseConvTensor(torch.zeros(0, 4), torch.zeros(0, 3, dtype=torch.int32), [5, 5], 1)
    assert spconv.SparseBatchNorm(4).train()(empty).features.shape == (0, 4)
    for m in (spconv.SparseBatchNorm(4), spconv.SparseReLU(), spconv.SparseIdentity(), _subm(1, 1),
              spconv.SparseMaxPool3d(2)):
        assert spconv.is_spconv_module(m)
    # As in spconv 2.3.8, Identity is a plain module: in a SparseSequential it gets (and returns) the features.
    assert not spconv.is_spconv_module(nn.ReLU()) and not spconv.is_spconv_module(spconv.Identity())
    assert torch.equal(spconv.SparseSequential(spconv.Identity())(x).features, x.features)
    # Inside a SparseSequential they get the SparseConvTensor itself.
    assert torch.equal(spconv.SparseSequential(spconv.SparseReLU())(x).features, torch.relu(x.features))


def test_todense_removegrid_identity_and_names():
    x = make_sparse([4, 5], 2, 3, n=12)
    assert torch.equal(spconv.ToDense()(x), x.dense())
    assert spconv.RemoveGrid()(x).grid is None
    assert spconv.Identity()(x) is x
    net = nn.Sequential(spconv.SparseSequential(_subm(2, 2), nn.ReLU()), nn.Linear(2, 2))
    spconv.assign_name_for_sparse_modules(net)
    assert net[0][0].name == "0.0" and net[0].name == "0"


# ---- tables ----

def _two_branches(x, cin=3):
    torch.manual_seed(1)
    return spconv.ConcatTable().add(_subm(cin, 4, "a")).add(_subm(cin, 4, "b"))


def test_add_and_join_tables_match_dense():
    x = make_sparse([6, 6, 6], 2, 3, n=50)
    branches = _two_branches(x)
    f = x.features.clone().requires_grad_(True)
    outs = branches(with_features(x, f))
    added = spconv.AddTable()(outs)
    joined = spconv.JoinTable()([outs[0], spconv.SparseSequential(_subm(4, 2, "c"))(outs[1])])
    torch.testing.assert_close(added.dense(), outs[0].dense() + outs[1].dense())
    assert joined.features.shape[1] == 6  # JoinTable concatenates different channel counts
    assert torch.equal(joined.features[:, :4], outs[0].features)
    g = torch.randn(added.dense().shape)
    (added.dense() * g).sum().backward()
    # d(sum)/d(each branch) = g read at the sites, then through each subm conv: compare with branch-wise grads.
    f2 = x.features.clone().requires_grad_(True)
    o2 = branches(with_features(x, f2))
    ((o2[0].dense() + o2[1].dense()) * g).sum().backward()
    torch.testing.assert_close(f.grad, f2.grad)


def test_tables_reject_misaligned():
    a = make_sparse([6, 6], 1, 2, n=10, seed=1)
    b = make_sparse([6, 6], 1, 2, n=11, seed=2)
    with pytest.raises(ValueError, match="AddTableMisaligned"):
        spconv.AddTable()([a, b])
    with pytest.raises(ValueError, match="channels"):
        spconv.AddTable()([a, with_features(a, torch.zeros(10, 3))])
    with pytest.raises(ValueError, match="spatial_shape"):
        spconv.JoinTable()([a, make_sparse([6, 7], 1, 2, n=10)])


@pytest.mark.parametrize("fn", [Fsp.sparse_add, Fsp.sparse_add_hash_based,
                                lambda *t: spconv.AddTableMisaligned()(list(t))])
def test_sparse_add_matches_dense_sum_with_gradients(fn):
    xs = [make_sparse([5, 6, 4], 2, 3, n=n, seed=s) for n, s in ((40, 1), (25, 2), (60, 3))]
    feats = [x.features.clone().requires_grad_(True) for x in xs]
    res = fn(*[with_features(x, f) for x, f in zip(xs, feats)])
    dense_sum = sum(x.dense() for x in xs)
    torch.testing.assert_close(res.dense(), dense_sum)
    union = torch.unique(torch.cat([x.indices for x in xs]), dim=0)
    assert res.indices.shape[0] == union.shape[0]
    g = torch.randn(dense_sum.shape)
    (res.dense() * g).sum().backward()
    for x, f in zip(xs, feats):
        torch.testing.assert_close(f.grad, gather_sites(g, x.indices))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_sparse_add_sums_in_operand_order_bitwise(device):
    # Overlapping operands, one with a repeated coordinate: every output is the sum of its contributors in
    # stacked-row order (largest operand first), the order CPU index_add uses; CUDA's atomics would not fix it.
    xs = [make_sparse([4, 4, 4], 1, 5, n=n, seed=s) for n, s in ((50, 4), (30, 5), (45, 6))]
    dup = xs[1].indices[:3]
    xs[1] = spconv.SparseConvTensor(torch.randn(33, 5), torch.cat([xs[1].indices, dup]), xs[1].spatial_shape, 1)
    xs = [with_features(x, x.features * 1e3 + 1e-3) for x in xs]  # magnitudes where the order changes the bits
    res = Fsp.sparse_add(*[spconv.SparseConvTensor(x.features.to(device), x.indices.to(device), x.spatial_shape, 1)
                           for x in xs])
    res = spconv.SparseConvTensor(res.features.cpu(), res.indices.cpu(), res.spatial_shape, 1)
    order = sorted(range(3), key=lambda i: -xs[i].indices.shape[0])
    order = [order[0]] + [i for i in range(3) if i != order[0]]
    keys = {tuple(r.tolist()): k for k, r in enumerate(res.indices)}
    expect = torch.zeros_like(res.features)
    for i in order:
        for row, f in zip(xs[i].indices, xs[i].features):
            expect[keys[tuple(row.tolist())]] += f
    assert torch.equal(res.features, expect)


def test_sparse_add_keeps_kernel_maps_only_when_coordinates_are_one_operands():
    x = make_sparse([6, 6, 6], 1, 2, n=40, seed=5)
    big = _subm(2, 2, "keep")(x)  # has indice_dict["keep"]
    sub = with_features(x, x.features * 3)
    sub = spconv.SparseConvTensor(sub.features[::2], sub.indices[::2], x.spatial_shape, 1)
    res = Fsp.sparse_add(sub, big)
    assert torch.equal(res.indices, big.indices)  # the largest operand's rows, in its order
    assert "keep" in res.indice_dict
    _subm(2, 2, "keep")(res)  # a later subm layer reuses the map with consistent rows
    other = make_sparse([6, 6, 6], 1, 2, n=10, seed=9)
    res2 = Fsp.sparse_add(big, other)
    if res2.indices.shape[0] > big.indices.shape[0]:
        assert res2.indice_dict == {}
    with pytest.raises(ValueError, match="channels"):
        Fsp.sparse_add(x, with_features(x, torch.zeros(40, 3)))


def test_remove_duplicate_keeps_first_rows():
    idx = torch.tensor([[0, 1, 1], [0, 2, 2], [0, 1, 1], [1, 1, 1], [0, 2, 2]], dtype=torch.int32)
    feats = torch.arange(10.0).reshape(5, 2)
    x = spconv.SparseConvTensor(feats, idx.clone(), [3, 3], 2)
    y = spconv.RemoveDuplicate()(x)
    assert torch.equal(y.indices, idx[[0, 1, 3]])
    assert torch.equal(y.features, feats[[0, 1, 3]])
    assert torch.equal(x.indices, idx)  # input untouched


# ---- spconv 2.x ops / functional entry points ----

def _conv_layer(kind):
    torch.manual_seed(3)
    if kind == "subm":
        return spconv.SubMConv3d(3, 5, 3, padding=1, bias=False)
    return spconv.SparseConv3d(3, 5, 3, stride=2, padding=1, bias=False)


@pytest.mark.parametrize("kind", ["subm", "conv"])
def test_ops_native_layout_matches_layer(kind):
    x = make_sparse([7, 7, 7], 2, 3, n=80, seed=4)
    layer = _conv_layer(kind)
    ref = layer(x)
    subm = kind == "subm"
    outids, pairs, counts = ops.get_indice_pairs(x.indices, 2, x.spatial_shape, ConvAlgo.Native, layer.kernel_size,
                                                 layer.stride, layer.padding, layer.dilation, [0, 0, 0], subm)
    assert pairs.shape == (2, 27, x.indices.shape[0]) and counts.dtype == torch.int32
    assert torch.equal(outids, ref.indices)
    w = layer.weight.detach()
    out = ops.indice_conv(x.features, w, pairs, counts, outids.shape[0], False, subm)
    torch.testing.assert_close(out, ref.features.detach())
    # Autograd Function: gradients equal the layer's.
    f = x.features.clone().requires_grad_(True)
    wf = w.clone().requires_grad_(True)
    fn = Fsp.indice_subm_conv if subm else Fsp.indice_conv
    y = fn(f, wf, pairs, counts, outids.shape[0], ConvAlgo.Native)
    g = torch.randn(y.shape)
    (y * g).sum().backward()
    f2 = x.features.clone().requires_grad_(True)
    (layer(with_features(x, f2)).features * g).sum().backward()
    torch.testing.assert_close(f.grad, f2.grad)
    torch.testing.assert_close(wf.grad, layer.weight.grad)
    dx, dw = ops.indice_conv_backward(x.features, w, g, pairs, counts, False, subm)
    torch.testing.assert_close(dx, f2.grad)
    torch.testing.assert_close(dw, layer.weight.grad)
    if not subm:  # the inverse conv over the same map = the transposed direction
        inv = Fsp.indice_inverse_conv(ref.features.detach(), torch.randn(3, 3, 3, 3, 5), pairs, counts,
                                      x.indices.shape[0], ConvAlgo.Native)
        assert inv.shape == (x.indices.shape[0], 3)


@pytest.mark.parametrize("kind", ["subm", "conv"])
@pytest.mark.parametrize("algo", [ConvAlgo.MaskImplicitGemm, ConvAlgo.MaskSplitImplicitGemm])
def test_ops_implicit_gemm_layout_matches_layer(kind, algo):
    x = make_sparse([7, 7, 7], 2, 3, n=80, seed=5)
    layer = _conv_layer(kind)
    f2 = x.features.clone().requires_grad_(True)
    ref = layer(with_features(x, f2))
    res = ops.get_indice_pairs_implicit_gemm(x.indices, 2, x.spatial_shape, algo, layer.kernel_size, layer.stride,
                                             layer.padding, layer.dilation, [0, 0, 0], kind == "subm")
    assert len(res) == 9
    outids, counts, pair_fwd, pair_bwd, mfwd, mbwd, afwd, abwd, masks = res
    assert torch.equal(outids, ref.indices)
    assert pair_fwd.shape == (27, outids.shape[0]) and pair_bwd.shape == (27, x.indices.shape[0])
    assert len(mfwd) == len(masks) == (2 if algo == ConvAlgo.MaskSplitImplicitGemm else 1)
    assert int(counts.sum()) == int((pair_fwd >= 0).sum())
    f = x.features.clone().requires_grad_(True)
    w = layer.weight.detach().clone().requires_grad_(True)
    y = Fsp.implicit_gemm(f, w, pair_fwd, pair_bwd, mfwd, mbwd, afwd, abwd, outids.shape[0], masks, True,
                          kind == "subm")
    torch.testing.assert_close(y, ref.features)
    g = torch.randn(y.shape)
    (y * g).sum().backward()
    (ref.features * g).sum().backward()
    torch.testing.assert_close(f.grad, f2.grad)
    torch.testing.assert_close(w.grad, layer.weight.grad)
    out, mask_out, _ = ops.implicit_gemm(x.features, layer.weight.detach(), pair_fwd, mfwd, afwd, outids.shape[0],
                                         masks, False, kind == "subm")
    assert mask_out is None
    with pytest.raises(ValueError, match="is_train"):
        ops.implicit_gemm_backward(x.features, layer.weight.detach(), g, pair_fwd, pair_bwd, mfwd, mbwd, afwd, abwd,
                                   None, masks, 32, kind == "subm")


def test_ops_pool_entry_points_match_layers():
    x = make_sparse([8, 8, 8], 2, 4, n=120, seed=6)
    f_ref = x.features.clone().requires_grad_(True)
    ref = spconv.SparseMaxPool3d(2)(with_features(x, f_ref))
    g = torch.randn(ref.features.shape)
    (ref.features * g).sum().backward()
    outids, pairs, counts = ops.get_indice_pairs(x.indices, 2, x.spatial_shape, ConvAlgo.Native, [2] * 3, [2] * 3,
                                                 [0] * 3, [1] * 3, [0] * 3)
    f = x.features.clone().requires_grad_(True)
    y = Fsp.indice_maxpool(f, pairs, counts, outids.shape[0])
    torch.testing.assert_close(y, ref.features.detach())
    (y * g).sum().backward()
    torch.testing.assert_close(f.grad, f_ref.grad)
    res = ops.get_indice_pairs_implicit_gemm(x.indices, 2, x.spatial_shape, ConvAlgo.MaskImplicitGemm, [2] * 3,
                                             [2] * 3, [0] * 3, [1] * 3, [0] * 3)
    f3 = x.features.clone().requires_grad_(True)
    y3 = Fsp.indice_maxpool_implicit_gemm(f3, res[2], res[3], outids.shape[0])
    (y3 * g).sum().backward()
    torch.testing.assert_close(f3.grad, f_ref.grad)
    avg_ref = spconv.SparseAvgPool3d(2)(x).features
    f4 = x.features.clone().requires_grad_(True)
    y4 = Fsp.indice_avgpool_implicit_gemm(f4, res[2], res[3], outids.shape[0], True)
    torch.testing.assert_close(y4, avg_ref)
    y4.sum().backward()
    count = (res[2] >= 0).sum(0)
    torch.testing.assert_close(f4.grad, (1.0 / count[res[3].max(0).values.long()].float())[:, None].expand(-1, 4))
    rows, cnt = ops.global_pool_rearrange(x.indices, 2)
    assert cnt.tolist() == torch.bincount(x.indices[:, 0].long(), minlength=2).tolist()
    for b in range(2):
        assert (x.indices[rows[b, :cnt[b]].long(), 0] == b).all()
    t = torch.tensor([3], dtype=torch.int32)
    ops.maximum_value_int_(t, 7)
    assert int(t) == 7


def test_ops_reject_bad_layouts():
    x = make_sparse([5, 5], 1, 2, n=8)
    with pytest.raises(ValueError, match="indice_pairs"):
        ops.indice_maxpool(x.features, torch.zeros(3, 4, 8, dtype=torch.int32), torch.zeros(4, dtype=torch.int32), 2)
    with pytest.raises(ValueError, match="indice_pair_num"):
        ops.indice_maxpool(x.features, torch.zeros(2, 4, 8, dtype=torch.int32), torch.full((4,), 9, dtype=torch.int32),
                           2)
