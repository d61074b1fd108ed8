"""Pickling and deepcopy of sparse modules, state_dict round trips, torch.save of a SparseConvTensor's tensors."""
import copy
import io
import pickle

import torch
from torch import nn

import spconv.pytorch as spconv
from support.reference import random_sparse


def _model():
    torch.manual_seed(0)
    return spconv.SparseSequential(
        spconv.SubMConv3d(3, 8, 3, indice_key="a"), spconv.SparseBatchNorm(8), nn.ReLU(),
        spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="down", bias=False), spconv.SparseMaxPool3d(1, 1),
        spconv.SubMConv3d(8, 8, 1), spconv.SparseInverseConv3d(8, 4, 3, indice_key="down"),
        spconv.SparseConvTranspose3d(4, 4, 3, 1, 1))


def _x():
    return random_sparse(3, [8, 8, 8], 2, 3, density=0.2, seed=0)


def _same_outputs(a, b):
    a.eval(), b.eval()
    ya, yb = a(_x()), b(_x())
    assert torch.equal(ya.indices, yb.indices) and torch.equal(ya.features, yb.features)


def test_pickle_and_deepcopy_modules():
    model = _model()
    model(_x())  # BN running stats move off their defaults
    for clone in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        assert repr(clone) == repr(model)
        _same_outputs(model, clone)
        # Independent parameters.
        with torch.no_grad():
            next(clone.parameters()).add_(1)
        assert not torch.equal(next(clone.parameters()), next(model.parameters()))


def test_state_dict_round_trip():
    model = _model()
    model.train()
    model(_x())
    buf = io.BytesIO()
    torch.save(model.state_dict(), buf)
    buf.seek(0)
    state = torch.load(buf, weights_only=True)
    assert set(state) == set(model.state_dict())
    assert state["0.weight"].shape == (8, 3, 3, 3, 3)  # spconv 2.x layout [Cout, *k, Cin]
    fresh = spconv.SparseSequential(*[copy.deepcopy(m) for m in _model()])
    for p in fresh.parameters():
        nn.init.zeros_(p)
    fresh.load_state_dict(state)
    _same_outputs(model, fresh)


def test_save_sparse_tensor_tensors():
    x = _x()
    model = _model()
    y = model[:4](x)  # carries stored kernel maps too
    buf = io.BytesIO()
    torch.save({"features": y.features.detach(), "indices": y.indices, "spatial_shape": y.spatial_shape,
                "batch_size": y.batch_size}, buf)
    buf.seek(0)
    d = torch.load(buf, weights_only=True)
    z = spconv.SparseConvTensor(d["features"], d["indices"], d["spatial_shape"], d["batch_size"])
    assert torch.equal(z.dense(), y.dense().detach())
    assert d["indices"].dtype == torch.int32


def test_deepcopy_and_pickle_sparse_tensor():
    x = _x()
    with torch.no_grad():  # like any torch tensor, only graph leaves deepcopy
        y = spconv.SubMConv3d(3, 4, 3, indice_key="a")(x)
    for z in (copy.deepcopy(y), pickle.loads(pickle.dumps(y))):
        assert torch.equal(z.features, y.features) and torch.equal(z.indices, y.indices)
        assert z.spatial_shape == y.spatial_shape and z.batch_size == y.batch_size
        # The stored kernel map travels along and is reused.
        w = spconv.SubMConv3d(4, 4, 3, indice_key="a")(z)
        assert torch.equal(w.indices, y.indices)
