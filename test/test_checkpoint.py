"""Checkpoints: spconv 2.x (KRSC) loads unchanged; spconv 1.x ([*k, Cin, Cout]) and SPCONV_SAVED_WEIGHT_LAYOUT
checkpoints are converted on load."""
import os
import subprocess
import sys

import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from spconv import constants
from support.surface import make_sparse


def _net():
    return spconv.SparseSequential(
        spconv.SubMConv3d(3, 5, 3, padding=1, indice_key="s1"), nn.BatchNorm1d(5), nn.ReLU(),
        spconv.SparseConv3d(5, 4, (3, 3, 2), stride=2, padding=1, bias=False, indice_key="d1"),
        spconv.SparseInverseConv3d(4, 2, (3, 3, 2), indice_key="d1"))


def _to_layout(w: torch.Tensor, layout: str) -> torch.Tensor:
    nd = w.dim() - 2
    if layout == "RSCK":  # spconv 1.x: [*k, Cin, Cout]
        return w.permute(*range(1, nd + 1), nd + 1, 0).contiguous()
    if layout == "RSKC":  # [*k, Cout, Cin]
        return w.permute(*range(1, nd + 1), 0, nd + 1).contiguous()
    return w


def _converted_state(src: nn.Module, layout: str):
    sd = src.state_dict()
    for k, v in list(sd.items()):
        if k.endswith("weight") and v.dim() == 5:
            sd[k] = _to_layout(v, layout)
    return sd


def _check_same(a: nn.Module, b: nn.Module):
    a.eval(), b.eval()
    x = make_sparse([8, 8, 6], 2, 3, n=80)
    torch.testing.assert_close(a(x).features, b(x).features)
    for (ka, va), (kb, vb) in zip(a.state_dict().items(), b.state_dict().items()):
        assert ka == kb and torch.equal(va, vb), ka


def test_spconv2_checkpoint_loads_unchanged(tmp_path):
    torch.manual_seed(0)
    src = _net()
    path = tmp_path / "ckpt.pth"
    torch.save(src.state_dict(), path)
    dst = _net()
    dst.load_state_dict(torch.load(path))
    _check_same(src, dst)


def test_spconv1_checkpoint_round_trip(tmp_path, monkeypatch):
    torch.manual_seed(1)
    src = _net()
    sd1 = _converted_state(src, "RSCK")
    assert sd1["0.weight"].shape == (3, 3, 3, 3, 5)  # [*k, Cin, Cout]
    path = tmp_path / "v1.pth"
    torch.save(sd1, path)
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "")
    dst = _net()
    dst.load_state_dict(torch.load(path))  # detected from the shapes
    _check_same(src, dst)
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "RSCK")
    dst2 = _net()
    dst2.load_state_dict(torch.load(path))  # told explicitly
    _check_same(src, dst2)


def test_rskc_layout(monkeypatch):
    torch.manual_seed(2)
    src = _net()
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "RSKC")
    dst = _net()
    dst.load_state_dict(_converted_state(src, "RSKC"))
    _check_same(src, dst)


def test_ambiguous_shape_needs_the_layout(monkeypatch):
    """Cin == Cout == kernel size: [*k, Cin, Cout] and [Cout, *k, Cin] have the same shape."""
    torch.manual_seed(3)
    src = spconv.SubMConv3d(3, 3, 3, padding=1)
    v1 = {"weight": _to_layout(src.weight.detach(), "RSCK"), "bias": src.bias.detach()}
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "")
    guessed = spconv.SubMConv3d(3, 3, 3, padding=1)
    guessed.load_state_dict(dict(v1))
    assert torch.equal(guessed.weight, v1["weight"])  # taken as KRSC
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "RSCK")
    told = spconv.SubMConv3d(3, 3, 3, padding=1)
    told.load_state_dict(dict(v1))
    assert torch.equal(told.weight, src.weight)


def test_wrong_shape_is_reported(monkeypatch):
    conv = spconv.SubMConv3d(3, 5, 3)
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "RSCK")
    with pytest.raises(RuntimeError, match="weight"):
        conv.load_state_dict({"weight": torch.zeros(5, 3, 3, 3, 3), "bias": torch.zeros(5)})
    monkeypatch.setattr(constants, "SAVED_WEIGHT_LAYOUT", "")
    with pytest.raises(RuntimeError, match="size mismatch"):
        conv.load_state_dict({"weight": torch.zeros(2, 3, 3, 3, 3), "bias": torch.zeros(5)})


def test_record_voxel_count_buffers():
    conv = spconv.SparseConv3d(2, 2, 3)
    sd = dict(conv.state_dict())
    sd["max_num_voxels_during_training"] = torch.tensor([5], dtype=torch.int32)
    conv.load_state_dict(sd)  # a spconv 2.x counter the module doesn't keep is ignored
    pool = spconv.SparseMaxPool3d(2, record_voxel_count=True)
    pool2 = spconv.SparseMaxPool3d(2, record_voxel_count=True)
    pool.get_max_num_voxels().fill_(9)
    pool2.load_state_dict(pool.state_dict())
    assert int(pool2.get_max_num_voxels()) == 9


def test_invalid_layout_env_is_rejected():
    env = dict(os.environ, SPCONV_SAVED_WEIGHT_LAYOUT="HWIO")
    res = subprocess.run([sys.executable, "-c", "import spconv"], env=env, capture_output=True, text=True)
    assert res.returncode != 0 and "SPCONV_SAVED_WEIGHT_LAYOUT" in res.stderr
