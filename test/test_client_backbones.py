"""The clients' sparse backbones (test/support/client_backbones.py, plus the networks of client_nets.py) run unchanged,
forward and backward, and agree with the real spconv 2.3.8.

Captured from spconv 2.3.8 by reference_worker.py (same weights, inputs and loss): FP64 outputs
(test/data/spconv238_client_outputs.npz, to 1e-12) and FP64 gradients of a fixed loss with respect to the input
features and every parameter (test/data/spconv238_client_grads.npz, to 1e-10); what produced them is in
test/data/spconv238_client_outputs.json. spconv 2.3.8's CPU-only build raises in its conv backward (it asks
torch.cuda for a stream); the capture ran its own backward with a null stream handle (reference_worker.py,
_cpu_stream_shim), and a finite-difference check of this package's gradients stands beside it. With
``SPCONV_REFERENCE_PYTHON`` set, everything is re-run live in FP64 and FP32; ``SPCONV_RECAPTURE=1`` rewrites the files.
"""
import json
import os

import numpy as np
import pytest
import torch

import spconv.pytorch as sp
from support import client_backbones
from support import client_nets as nets

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.join(HERE, "data")
OUTPUTS = os.path.join(DATA, "spconv238_client_outputs.npz")
GRADS = os.path.join(DATA, "spconv238_client_grads.npz")
ABOUT = os.path.join(DATA, "spconv238_client_outputs.json")
WORKER = os.path.join(HERE, "support", "reference_worker.py")
BUILDERS = {**nets.BUILDERS, **client_backbones.BUILDERS}
OUT_TOL = {torch.float64: 1e-12, torch.float32: 1e-5}
GRAD_TOL = {torch.float64: 1e-10, torch.float32: 3e-5}  # measured worst: 1.5e-14, 4.2e-6
# The site sets of these depend on ranking scores (top-k, nearest points), which bfloat16 may reorder.
AUTOCAST_NETS = sorted(set(BUILDERS) - {"pcdet_focal", "mmdet3d_sassd"})


def _rel(a, b):
    scale = np.abs(b).max() if b.size else 0.0
    return float(np.abs(a - b).max() / scale) if scale > 0 else float(np.abs(a - b).max() if a.size else 0.0)


def _sorted_rows(indices, features):
    """Rows ordered by site, then (for the repeated sites of a concatenation, as VoxelNeXt makes) by features."""
    keys = [features[:, j] for j in reversed(range(features.shape[1]))]
    return np.lexsort(keys + [indices[:, j] for j in reversed(range(indices.shape[1]))])


def check_outputs(name, mine, theirs, tol):
    """Same keys; sparse outputs on the same sites (row order is not promised) with the same features per site."""
    assert sorted(mine) == sorted(k.split("/", 1)[1] for k in theirs if k.startswith(name + "/")), name
    for key, value in mine.items():
        ref = theirs[f"{name}/{key}"]
        if key.endswith(".spatial_shape"):
            assert value.tolist() == ref.tolist(), (name, key)
        elif key.endswith(".dense"):
            assert value.shape == ref.shape and _rel(value, ref) < tol, (name, key, _rel(value, ref))
        elif key.endswith(".features"):
            base = key[:-len(".features")]
            mi, ri = mine[base + ".indices"], theirs[f"{name}/{base}.indices"]
            mo, ro = _sorted_rows(mi, value), _sorted_rows(ri, ref)
            assert np.array_equal(mi[mo], ri[ro]), (name, base, "sites differ")
            assert value.shape == ref.shape and _rel(value[mo], ref[ro]) < tol, (name, key, _rel(value[mo], ref[ro]))


def check_grads(name, mine, theirs, tol):
    """Gradients of the input features (rows in input order) and of every parameter, by name."""
    assert sorted(mine) == sorted(k.split("/", 1)[1] for k in theirs if k.startswith(name + "/")), name
    for key, value in mine.items():
        ref = theirs[f"{name}/{key}"]
        assert value.shape == ref.shape and np.abs(ref).max() > 0, (name, key)
        assert _rel(value, ref) < tol, (name, key, _rel(value, ref))


def _load(path):
    with np.load(path) as d:
        return {k: d[k] for k in d.files}


@pytest.fixture(scope="module")
def captured():
    return _load(OUTPUTS), _load(GRADS)


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(BUILDERS))
def test_backbone_forward_backward_matches_spconv238_fp64(name, captured):
    outputs, grads = captured
    mine, mine_grads = nets.run_net(sp, BUILDERS, name, torch.float64, backward=True)
    check_outputs(name, mine, outputs, OUT_TOL[torch.float64])
    check_grads(name, mine_grads, grads, GRAD_TOL[torch.float64])


def test_capture_record_names_every_network_and_its_source():
    with open(ABOUT) as fh:
        about = json.load(fh)
    assert about["environment"]["spconv"] == "2.3.8" and about["nets"] == sorted(BUILDERS)
    with np.load(OUTPUTS) as d:
        assert sorted({k.split("/", 1)[0] for k in d.files}) == sorted(BUILDERS)


class _Tiny(torch.nn.Module):
    """run_net's loss of a network on a handful of sites, as a function of the input features."""

    def __init__(self, name):
        super().__init__()
        self.name = name
        self.net = nets.build_net(sp, BUILDERS, name, torch.float64)
        spec = dict(BUILDERS[name].INPUT, n=12)
        self.x = nets.make_input(sp, cin=spec["cin"], shape=spec["shape"], n_per_batch=spec["n"])

    def forward(self, features):
        return nets.net_loss(sp, self.net(self.x.replace_feature(features)))


def _directional_fd(tiny, features, params, directions, eps=1e-6):
    """Central difference of the loss along a direction in input features and parameters together."""
    def shifted(sign):
        with torch.no_grad():
            for p, d in zip(params, directions[1:]):
                p.add_(d, alpha=sign * eps)
        value = float(tiny(features + sign * eps * directions[0]).detach())  # grad on: net_loss keeps what has one
        with torch.no_grad():
            for p, d in zip(params, directions[1:]):
                p.sub_(d, alpha=sign * eps)
        return value
    return (shifted(1) - shifted(-1)) / (2 * eps)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["pcdet_voxelnext", "pcdet_focal", "pointcept_spunet_v1m1"])
def test_backbone_backward_against_finite_differences(name):
    """This package's FP64 gradients against central differences along random directions, independently of
    spconv 2.3.8: input features apart (a 0.1% error in their gradient fails it) and all parameters together
    (each parameter's gradient alone is held to spconv 2.3.8's, 1e-10, above)."""
    tiny = _Tiny(name)
    features = tiny.x.features.clone().requires_grad_()
    params = [p for p in tiny.net.parameters()]
    tiny(features).backward()
    grads = [features.grad] + [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    assert float(features.grad.abs().max()) > 0
    gen = torch.Generator().manual_seed(1)
    for part in ("features", "parameters", "features", "parameters"):  # apart: each part's error shows alone
        directions = [torch.randn(g.shape, generator=gen, dtype=torch.float64) for g in grads]
        directions = [d * ((i == 0) == (part == "features")) for i, d in enumerate(directions)]
        analytic = float(sum((g * d).sum() for g, d in zip(grads, directions)))
        numeric = _directional_fd(tiny, features.detach(), params, directions)
        assert abs(numeric - analytic) <= 1e-5 * abs(analytic), (name, part, numeric, analytic)


def _l2_bound(net):
    """norm(diff) < 10 * max(1, max(Cin, Cout) / 16), with the widest conv of the network."""
    widest = max(max(m.in_channels, m.out_channels) for m in net.modules() if isinstance(m, sp.conv.SparseConvolution))
    return 10 * max(1.0, widest / 16)


@pytest.mark.slow
@pytest.mark.parametrize("name", AUTOCAST_NETS)
def test_backbone_runs_under_cpu_autocast(name):
    """Forward and backward under torch.autocast on the CPU (bfloat16 there: convs, norms and dense() run in it)
    against the FP32 run. Outputs and the input-feature gradient: norm(diff) < 10 * max(1, max(Cin, Cout) / 16);
    outputs also within 2% relative L2 (measured <= 1%, one conv alone 0.3% as torch's bfloat16 matmul), all
    gradients together within 15% (measured <= 7.3%: ReLU gates and eval-mode norms in bfloat16 compound)."""
    ref, ref_grads = nets.run_net(sp, BUILDERS, name, torch.float32, backward=True)
    low, low_grads = nets.run_net(sp, BUILDERS, name, torch.float32, backward=True, autocast_dtype=torch.bfloat16)
    bound = _l2_bound(nets.build_net(sp, BUILDERS, name, torch.float32))
    assert sorted(low) == sorted(ref) and sorted(low_grads) == sorted(ref_grads)
    rel = []
    for key, value in ref.items():
        if key.endswith(".features") or key.endswith(".dense"):
            if key.endswith(".features"):
                base = key[:-len(".features")]
                assert np.array_equal(low[base + ".indices"], ref[base + ".indices"]), (name, base)
            diff = np.linalg.norm(low[key].astype(np.float64) - value)
            rel.append(diff / np.linalg.norm(value))
            assert diff < bound and rel[-1] <= 0.02, (name, key, diff, rel[-1])
    assert max(rel) > 1e-4, "the outputs are FP32's: autocast did not reach the network"
    assert np.linalg.norm(low_grads["input"] - ref_grads["input"]) < bound
    total = sum(np.sum((low_grads[k].astype(np.float64) - v) ** 2) for k, v in ref_grads.items())
    scale = sum(np.sum(v.astype(np.float64) ** 2) for v in ref_grads.values())
    assert np.sqrt(total / scale) <= 0.15, (name, np.sqrt(total / scale))


def _reference_python():
    python = os.environ.get("SPCONV_REFERENCE_PYTHON")
    if not python:
        pytest.skip("SPCONV_REFERENCE_PYTHON is not set (an interpreter importing the real spconv 2.3.8)")
    return python


def test_live_backbones_against_reference(tmp_path):
    python = _reference_python()
    from spconv.benchmark import compare
    target = compare.resolve_target(python)
    job = {"task": "forward", "nets": sorted(BUILDERS), "dtypes": ["float64", "float32"], "backward": True}
    result = compare.run_worker(target, WORKER, str(tmp_path), job, timeout_s=600)
    for dtype_name in job["dtypes"]:
        dtype = getattr(torch, dtype_name)
        outputs, grads = _load(tmp_path / f"forward_{dtype_name}.npz"), _load(tmp_path / f"grads_{dtype_name}.npz")
        for name in job["nets"]:
            mine, mine_grads = nets.run_net(sp, BUILDERS, name, dtype, backward=True)
            check_outputs(name, mine, outputs, OUT_TOL[dtype])
            check_grads(name, mine_grads, grads, GRAD_TOL[dtype])
    auto_dir = tmp_path / "autocast"
    auto_dir.mkdir()
    autocast = compare.run_worker(target, WORKER, str(auto_dir), {"task": "autocast", "nets": AUTOCAST_NETS},
                                  timeout_s=600)["autocast"]
    if os.environ.get("SPCONV_RECAPTURE") == "1":
        _recapture(tmp_path, result, autocast)
    fresh_out, fresh_grads = _load(tmp_path / "forward_float64.npz"), _load(tmp_path / "grads_float64.npz")
    for stored, fresh in ((_load(OUTPUTS), fresh_out), (_load(GRADS), fresh_grads)):  # the files are not stale
        assert sorted(stored) == sorted(fresh)
        assert all(np.array_equal(stored[k], fresh[k]) or _rel(stored[k], fresh[k]) < 1e-12 for k in stored)


def _recapture(tmp_path, result, autocast):
    import shutil
    shutil.copyfile(tmp_path / "forward_float64.npz", OUTPUTS)
    shutil.copyfile(tmp_path / "grads_float64.npz", GRADS)
    about = {
        "_about": [
            "Outputs (FP64) and gradients (FP64) of test/support/client_nets.py and test/support/client_backbones.py under the real "
            "spconv 2.3.8 (CPU-only wheel), written by test/support/reference_worker.py with one torch thread.",
            "Gradients: spconv 2.3.8's CPU-only build raises AssertionError('Torch not compiled with CUDA "
            "enabled') in its conv backward (spconv/pytorch/ops.py indice_conv_backward -> cppcore."
            "get_current_stream -> torch.cuda.current_stream); the capture replaces ops.get_current_stream by a "
            "null stream handle, and spconv 2.3.8's own CPU backward runs.",
            "autocast_cpu: what spconv 2.3.8 does under torch.autocast('cpu') (bfloat16), per network.",
            "Re-capture: SPCONV_REFERENCE_PYTHON=<its python> SPCONV_RECAPTURE=1 python -m pytest "
            "test/test_client_backbones.py -k live (rewrites the .npz files and this one).",
        ],
        "environment": result["environment"],
        "backward_stream_shim": result["forward"]["backward_stream_shim"],
        "nets": sorted(BUILDERS),
        "autocast_cpu": autocast,
    }
    with open(ABOUT, "w") as fh:
        json.dump(about, fh, indent=1, sort_keys=True)
