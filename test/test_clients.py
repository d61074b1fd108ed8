"""The ways OpenPCDet, mmdetection3d, Pointcept and CenterPoint use spconv 2.x, exercised as they do it: version
checks at import, walks over spconv.conv.SparseConvolution, replace_feature, shared indice keys and inverse convs,
checkpoint loading with weight permutes, and their network shapes (test/support/client_nets.py) against spconv 2.3.8.

The networks' outputs are checked against outputs of the real spconv 2.3.8 (FP64, captured into
test/data/spconv238_client_outputs.npz by reference_worker.py with the same weights and inputs); with
``SPCONV_REFERENCE_PYTHON`` set, also live in FP64 and FP32.
"""
import os
import re

import numpy as np
import pytest
import torch
from torch import nn

import spconv
import spconv.pytorch as sp
from support import client_nets as nets

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
CAPTURED = os.path.join(HERE, "data", "spconv238_client_outputs.npz")
WORKER = os.path.join(HERE, "support", "reference_worker.py")
TOL = {torch.float64: 1e-12, torch.float32: 1e-5}


def _outputs(name, dtype=torch.float64, train=False):
    net = nets.BUILDERS[name](sp, 4)
    net.load_state_dict(nets.deterministic_state(net))
    net = nets.eval_mode(sp, net.to(dtype))
    with torch.no_grad():
        return nets.output_arrays(sp, net(nets.make_input(sp, dtype=dtype)))


def _rel(a, b):
    scale = np.abs(b).max() if b.size else 0.0
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max() if a.size else 0.0)


def _check_against(name, mine, theirs, tol):
    """Sparse outputs: same sites (row order is not promised for regular convs), same features per site."""
    for key, value in mine.items():
        ref = theirs[f"{name}/{key}"]
        if key.endswith(".dense"):
            assert value.shape == ref.shape and _rel(value, ref) < tol, (name, key)
        elif key.endswith(".spatial_shape"):
            assert value.tolist() == ref.tolist(), (name, key)
        elif key.endswith(".features"):
            base = key[:-len(".features")]
            mi, ri = mine[base + ".indices"], theirs[f"{name}/{base}.indices"]
            mo, ro = np.lexsort(mi.T[::-1]), np.lexsort(ri.T[::-1])
            assert np.array_equal(mi[mo], ri[ro]), (name, base, "sites differ")
            assert _rel(value[mo], ref[ro]) < tol, (name, key)


@pytest.mark.parametrize("name", sorted(nets.BUILDERS))
def test_network_matches_spconv238_fp64(name):
    with np.load(CAPTURED) as theirs:
        _check_against(name, _outputs(name), {k: theirs[k] for k in theirs.files}, TOL[torch.float64])


def test_live_networks_against_reference(tmp_path):
    python = os.environ.get("SPCONV_REFERENCE_PYTHON")
    if not python:
        pytest.skip("SPCONV_REFERENCE_PYTHON is not set (an interpreter importing the real spconv 2.3.8)")
    from spconv.benchmark import compare
    job = {"task": "forward", "nets": sorted(nets.BUILDERS), "dtypes": ["float64", "float32"]}
    compare.run_worker(compare.resolve_target(python), WORKER, str(tmp_path), job, timeout_s=600)
    for dtype_name in job["dtypes"]:
        dtype = getattr(torch, dtype_name)
        with np.load(tmp_path / f"forward_{dtype_name}.npz") as d:
            theirs = {k: d[k] for k in d.files}
        for name in job["nets"]:
            _check_against(name, _outputs(name, dtype), theirs, TOL[dtype])
    with np.load(CAPTURED) as stored:  # the committed capture is still what spconv 2.3.8 computes
        fresh = np.load(tmp_path / "forward_float64.npz")
        mine = sorted(k for k in stored.files if k.split("/", 1)[0] in nets.BUILDERS)  # the rest: backbones' test
        assert mine == sorted(fresh.files)
        for k in mine:
            assert np.array_equal(stored[k], fresh[k]) or _rel(stored[k], fresh[k]) < 1e-12, k


def test_version_checks_clients_make_at_import(monkeypatch):
    v = spconv.__version__
    assert re.fullmatch(r"\d+\.\d+\.\d+", v)
    assert float(v[2:]) >= 2.2  # OpenPCDet, then it turns the direct table off
    monkeypatch.setattr(spconv.constants, "SPCONV_USE_DIRECT_TABLE", False)  # settable, no effect here
    assert hasattr(spconv, "__version__") and v >= "2.0.0"  # mmdetection3d
    assert spconv.SPCONV_VERSION_NUMBERS == list(map(int, v.split("."))) and spconv.SPCONV_VERSION_NUMBERS >= [2, 2]
    assert spconv.AlgoHint.Fowrard.value == 1 and spconv.__dev_tag__
    # setup.py takes the first double-quoted string of _version.py as the package version.
    with open(os.path.join(ROOT, "spconv", "_version.py")) as fh:
        assert fh.read().split('"')[1] == v


def _spconv_weight_keys(model, prefix=""):
    """A walk over named_children collecting the weight keys of every spconv.conv.SparseConvolution."""
    keys = set()
    for name, child in model.named_children():
        path = f"{prefix}.{name}" if prefix else name
        if isinstance(child, sp.conv.SparseConvolution):
            keys.add(f"{path}.weight")
        keys |= _spconv_weight_keys(child, path)
    return keys


def _load_adapting_spconv1(model, disk_state):
    """OpenPCDet-style load: spconv weights of another shape are first tried transposed in the last two axes,
    then permuted (k1, k2, k3, Cin, Cout) -> (Cout, k1, k2, k3, Cin); then a strict load_state_dict."""
    local = model.state_dict()
    keys = _spconv_weight_keys(model)
    update = {}
    for key, val in disk_state.items():
        if key in keys and key in local and local[key].shape != val.shape:
            swapped = val.transpose(-1, -2)
            if swapped.shape == local[key].shape:
                val = swapped.contiguous()
            elif val.permute(4, 0, 1, 2, 3).shape == local[key].shape:
                val = val.permute(4, 0, 1, 2, 3).contiguous()
        if key in local and local[key].shape == val.shape:
            update[key] = val
    model.load_state_dict(update)


def test_spconv_key_walk_and_spconv1_checkpoint_adaptation():
    net = nets.PcdetBackbone8x(sp, 4)
    keys = _spconv_weight_keys(net)
    convs = [n for n, m in net.named_modules() if isinstance(m, sp.conv.SparseConvolution)]
    assert keys == {f"{n}.weight" for n in convs} and len(keys) == 8
    net.load_state_dict(nets.deterministic_state(net, torch.float32))
    # A spconv 1.x checkpoint: conv weights (k1, k2, k3, Cin, Cout).
    disk = {k: (v.permute(1, 2, 3, 4, 0).contiguous() if k in keys else v) for k, v in net.state_dict().items()}
    fresh = nets.PcdetBackbone8x(sp, 4)
    _load_adapting_spconv1(fresh, disk)
    for k, v in net.state_dict().items():
        assert torch.equal(fresh.state_dict()[k], v), k


def test_replace_feature_as_clients_call_it():
    x = nets.make_input(sp, dtype=torch.float32)
    y = sp.SubMConv3d(4, 6, 3, indice_key="subm1")(x)
    assert "replace_feature" in y.__dir__()  # OpenPCDet's spconv 2.x test
    z = y.replace_feature(torch.relu(y.features))
    assert z is not y and torch.equal(z.features, torch.relu(y.features))
    assert z.indices is y.indices and z.indice_dict["subm1"] is y.indice_dict["subm1"]
    assert z.spatial_shape == y.spatial_shape and z.batch_size == y.batch_size
    w = y.replace_feature(torch.zeros(3, 6))  # accepted, as in spconv 2.x; the consumer checks the rows
    with pytest.raises(ValueError, match="SubMConv3d: features and indices must have the same number of rows"):
        sp.SubMConv3d(6, 6, 3)(w)


def test_indice_keys_are_shared_and_inverse_convs_restore_sites():
    x = nets.make_input(sp, dtype=torch.float32)
    net = nets.PcdetUNet(sp, 4).eval()
    seen = {}

    def record(module, inputs, output):
        if isinstance(output, sp.SparseConvTensor):
            for key, data in output.indice_dict.items():
                seen.setdefault(key, set()).add(id(data))

    hooks = [m.register_forward_hook(record) for m in net.modules() if isinstance(m, sp.conv.SparseConvolution)]
    y = net(x)["seg"]
    for h in hooks:
        h.remove()
    # each key's kernel map was built once and reused by every later layer with that key
    assert set(seen) == {"subm1", "spconv2", "subm2"} and all(len(ids) == 1 for ids in seen.values())
    assert torch.equal(y.indices, x.indices) and y.spatial_shape == x.spatial_shape
    # and the whole network trains on the CPU (spconv 2.3.8's CPU wheel needs a null stream handle for that:
    # test_client_backbones.py compares gradients with it)
    net.train()
    out = net(x)["seg"]
    out.features.square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in net.parameters())


def test_ptv3_style_positional_encoding_keeps_sites():
    x = nets.make_input(sp, cin=8, dtype=torch.float32)
    cpe = sp.SparseSequential(sp.SubMConv3d(8, 8, 3, bias=True, indice_key="cpe"), nn.Linear(8, 8), nn.LayerNorm(8))
    y = cpe(x)
    assert torch.equal(y.indices, x.indices) and y.features.shape == x.features.shape
    assert "cpe" in y.indice_dict


def test_mmdet3d_checkpoint_loading(monkeypatch):
    torch.manual_seed(0)
    src = nets.Spconv1Checkpoint(sp)
    src.b.get_max_num_voxels().fill_(7)
    v1 = nets.spconv1_state(src)
    # mmdetection3d's path: its SparseModule._load_from_state_dict reaches every conv (as in spconv 2.x) and
    # permutes the 1.x weights, ambiguous shapes included; the shape-based conversion here stands aside.
    monkeypatch.setattr(sp.SparseModule, "_version", 2)
    monkeypatch.setattr(sp.SparseModule, "_load_from_state_dict", nets.mmdet3d_style_load)
    dst = nets.Spconv1Checkpoint(sp)
    dst.load_state_dict(v1, strict=True)
    for k, v in src.state_dict().items():
        assert torch.equal(dst.state_dict()[k], v), k
    # a checkpoint saved under the patch (metadata version 2) loads unpermuted
    saved = dst.state_dict()
    assert saved._metadata["a"]["version"] == 2
    again = nets.Spconv1Checkpoint(sp)
    again.load_state_dict(saved, strict=True)
    assert all(torch.equal(again.state_dict()[k], v) for k, v in saved.items())
    monkeypatch.undo()
    # Plain loading of the same 1.x checkpoint: the weights are converted from their shape, except the ambiguous
    # one (taken as 2.x), which needs SPCONV_SAVED_WEIGHT_LAYOUT=RSCK.
    plain = nets.Spconv1Checkpoint(sp)
    plain.load_state_dict(v1, strict=True)
    for k in ("a.weight", "b.weight", "a.bias", "b.max_num_voxels_during_training"):
        assert torch.equal(plain.state_dict()[k], src.state_dict()[k]), k
    monkeypatch.setattr(spconv.constants, "SAVED_WEIGHT_LAYOUT", "RSCK")
    only_c = {k: v for k, v in v1.items() if k.startswith("c.")}
    plain.c.load_state_dict({k[2:]: v for k, v in only_c.items()})
    assert torch.equal(plain.c.weight, src.c.weight)


def test_live_mmdet3d_loading_against_reference(tmp_path, monkeypatch):
    python = os.environ.get("SPCONV_REFERENCE_PYTHON")
    if not python:
        pytest.skip("SPCONV_REFERENCE_PYTHON is not set (an interpreter importing the real spconv 2.3.8)")
    from spconv.benchmark import compare
    result = compare.run_worker(compare.resolve_target(python), WORKER, str(tmp_path), {"task": "mmdet3d_load"},
                                timeout_s=600)
    assert result["mmdet3d_load"]["metadata_version"] == 2
    src = nets.Spconv1Checkpoint(sp)
    src.load_state_dict(nets.deterministic_state(src, torch.float32))
    monkeypatch.setattr(sp.SparseModule, "_version", 2)
    monkeypatch.setattr(sp.SparseModule, "_load_from_state_dict", nets.mmdet3d_style_load)
    dst = nets.Spconv1Checkpoint(sp)
    dst.load_state_dict(nets.spconv1_state(src), strict=True)
    with np.load(tmp_path / "mmdet3d_load.npz") as theirs:
        for k, v in dst.state_dict().items():
            np.testing.assert_array_equal(v.numpy(), theirs[f"loaded/{k}"], err_msg=k)  # what spconv 2.3.8 loads
            np.testing.assert_array_equal(theirs[f"src/{k}"], src.state_dict()[k].numpy(), err_msg=k)


def test_voxel_counter_checkpoints_load_both_ways():
    with_counter = sp.SparseConv3d(2, 3, 3, record_voxel_count=True)
    without = sp.SparseConv3d(2, 3, 3)
    assert with_counter.get_max_num_voxels().dtype == torch.int32 and without.get_max_num_voxels() is None
    with_counter.get_max_num_voxels().fill_(11)
    without.load_state_dict(with_counter.state_dict(), strict=True)  # spconv checkpoint with the buffer
    fresh = sp.SparseConv3d(2, 3, 3, record_voxel_count=True)
    fresh.load_state_dict(without.state_dict(), strict=True)  # checkpoint without it
    assert int(fresh.get_max_num_voxels()) == 0
    fresh.load_state_dict(with_counter.state_dict(), strict=True)
    assert int(fresh.get_max_num_voxels()) == 11
    # it records the largest output count, in training and inference as spconv 2.x does
    x = nets.make_input(sp, cin=2, dtype=torch.float32)
    fresh.eval()(x)
    assert int(fresh.get_max_num_voxels()) == max(11, fresh(x).indices.shape[0])


# Synthetic xyz + intensity points and generator settings whose spconv 2.3.8 results are in
# test/data/spconv238_voxels.npz (a cap that binds, 2-D, and 4-D with intensity as the fourth axis).
VOXELS_CAPTURED = os.path.join(HERE, "data", "spconv238_voxels.npz")
VOXEL_CONFIGS = [[3, [0.8, 0.8, 0.5], [-10, -10, -2, 10, 10, 1], 20000, 5],
                 [3, [2.0, 2.0, 5.0], [-12, -12, -3, 12, 12, 2], 100, 8],
                 [2, [1.5, 1.5], [-12, -12, 12, 12], 5000, 3],
                 [4, [2, 2, 1, 0.5], [-12, -12, -3, 0, 12, 12, 2, 1], 5000, 4]]


def _voxel_points():
    rs = np.random.RandomState(5)  # numpy's legacy stream: fixed across versions
    xyz = rs.uniform([-12, -12, -3], [12, 12, 2], size=(3000, 3))
    return np.concatenate([xyz, rs.uniform(0, 1, size=(3000, 1))], 1).astype(np.float32)


def _voxelize(points, configs):
    """OpenPCDet's data-processor call: Point2VoxelCPU*(...).point_to_voxel(tv.from_numpy(points)), .numpy()."""
    import cumm.tensorview as tv
    import spconv.utils as su
    out = []
    for ndim, vsize, rng, max_voxels, max_points in configs:
        gen = getattr(su, f"Point2VoxelCPU{ndim}d")(vsize, rng, points.shape[1], max_voxels, max_points)
        results = gen.point_to_voxel(tv.from_numpy(points))
        assert all(isinstance(r, tv.Tensor) for r in results)
        out.append(dict(zip(("voxels", "coords", "num"), (r.numpy() for r in results)), grid_size=gen.grid_size))
    return out


def _check_voxels(mine, ref):
    assert mine["grid_size"] == ref["grid_size"].tolist()
    for key in ("coords", "num", "voxels"):
        assert mine[key].dtype == ref[key].dtype, key
        np.testing.assert_array_equal(mine[key], ref[key])


def test_voxel_generation_matches_spconv238():
    with np.load(VOXELS_CAPTURED) as ref:
        for i, mine in enumerate(_voxelize(_voxel_points(), VOXEL_CONFIGS)):
            _check_voxels(mine, {k.split("/", 1)[1]: ref[k] for k in ref.files if k.startswith(f"{i}/")})


def _points_file():
    for folder in (os.environ.get("SPCONV_TEST_DATA", ""), os.path.join(ROOT, "shared", "data"),
                   os.path.join(ROOT, "..", "shared", "data")):
        path = os.path.join(folder, "lidar-points-198k.npz")
        if folder and os.path.isfile(path):
            return path
    return None


def test_live_voxel_generation_against_reference(tmp_path):
    """The same pipeline on both sides, on the real scan where it is here, and on the captured synthetic points."""
    python = os.environ.get("SPCONV_REFERENCE_PYTHON")
    if not python:
        pytest.skip("SPCONV_REFERENCE_PYTHON is not set (an interpreter importing the real spconv 2.3.8)")
    from spconv.benchmark import compare
    target = compare.resolve_target(python)
    cases = [(str(tmp_path / "synthetic.npz"), VOXEL_CONFIGS)]
    np.savez(cases[0][0], pc=_voxel_points())
    scan = _points_file()
    if scan is not None:
        cases.append((scan, [[3, [0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1], 16000, 5],
                             [3, [0.2, 0.2, 0.2], [-50, -50, -5, 50, 50, 3], 40000, 10],
                             [1, [0.1], [-50, 50], 5000, 4]]))
    for n, (path, configs) in enumerate(cases):
        job_dir = tmp_path / f"job{n}"
        job_dir.mkdir()
        compare.run_worker(target, WORKER, str(job_dir), {"task": "voxels", "points": path, "configs": configs},
                           timeout_s=600)
        for i, mine in enumerate(_voxelize(np.load(path)["pc"], configs)):
            with np.load(job_dir / f"vox_{i}.npz") as ref:
                _check_voxels(mine, {k: ref[k] for k in ref.files})
