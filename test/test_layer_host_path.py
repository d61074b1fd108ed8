"""The lean per-layer path: a layer that needs no gradient skips the ops' Python autograd wrappers, and a tensor's
consistency check runs once per tensor; results, gradients and the checks of bad input stay what they are."""
import cProfile
import pstats

import pytest
import torch

import spconv.pytorch as spconv


def _scene(n=40, c=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    lin = torch.randperm(16 ** 3, generator=g)[:n]
    idx = torch.stack([torch.zeros_like(lin), lin // 256, (lin // 16) % 16, lin % 16], 1).int()
    return spconv.SparseConvTensor(torch.randn(n, c, generator=g), idx, [16, 16, 16], 1)


def _layers():
    torch.manual_seed(0)
    return [spconv.SubMConv3d(16, 16, 3, indice_key="k"), spconv.SparseConv3d(16, 8, 3, 2, 1),
            spconv.SubMConv3d(16, 8, 1), spconv.SubMConv3d(16, 16, 3, groups=4)]


@pytest.mark.parametrize("i", range(4))
def test_no_grad_path_gives_the_same_bits(i):
    layer = _layers()[i]
    x = _scene()
    with torch.no_grad():
        a = layer(x).features
    b = layer(x).features  # through the autograd formulas (the weight needs a gradient)
    assert b.requires_grad and not a.requires_grad
    assert torch.equal(a, b.detach())


def test_gradients_flow_where_asked():
    layer = _layers()[0]
    x = _scene()
    f = x.features.clone().requires_grad_(True)
    y = layer(x.replace_feature(f))
    y.features.sum().backward()
    assert f.grad is not None and layer.weight.grad is not None and bool(layer.weight.grad.abs().sum() > 0)
    layer.weight.requires_grad_(False)  # frozen weight, features still differentiable
    f2 = x.features.clone().requires_grad_(True)
    layer(x.replace_feature(f2)).features.sum().backward()
    assert torch.equal(f2.grad, f.grad)


def _called(fn):
    prof = cProfile.Profile()
    prof.enable()
    fn()
    prof.disable()
    return {name for (_, _, name) in pstats.Stats(prof).stats}


def test_inference_skips_the_autograd_wrappers():
    layer = _layers()[0]
    x = _scene()
    with torch.no_grad():
        y = layer(x)
        names = _called(lambda: layer(y))  # map cached under "k"
    assert "autograd_impl" not in names and "forward_no_grad" not in names
    names = _called(lambda: layer(y))  # a gradient is needed: the formulas run
    assert "autograd_impl" in names


def test_consistency_check_runs_again_when_the_tensor_changes():
    layer = _layers()[0]
    x = _scene()
    layer(x)
    full = x.indices
    x.indices = full[:-1]
    with pytest.raises(ValueError, match="same number of rows"):
        layer(x)
    x.indices = full.clone()
    layer(x)
    x.spatial_shape = [16, 16]
    with pytest.raises(ValueError, match="spatial_shape"):
        layer(x)


def test_consistency_memo_is_not_pickled():
    import pickle
    x = _scene()
    x.check_consistent("x")
    y = pickle.loads(pickle.dumps(x))
    assert "_consistent" not in y.__dict__
    y.check_consistent("y")


def test_host_time_worker_leaves_the_kernels_out(hip_cpu):
    """bench/layer_host_worker.py's gpu-code mode times the layer through the GPU code built for the CPU and
    reports each call's time outside the kernels' bodies (positive; the kernels' time, reported apart, too); the
    CPU route has no kernel time to leave out."""
    import json
    import os
    import subprocess
    import sys
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    req = json.dumps({"case": "train_cached", "calls": 3, "warmup": 1, "voxels": 40, "channels": 16})
    answers = {}
    for module in ("spconv.pytorch:gpu-code", "spconv.pytorch"):
        out = subprocess.run([sys.executable, os.path.join(root, "bench", "layer_host_worker.py"), module],
                             input=req + "\n\n", capture_output=True, text=True, timeout=600,
                             env=dict(os.environ, PYTHONPATH=root), cwd=root)
        assert out.returncode == 0, out.stderr[-2000:]
        answers[module] = json.loads(out.stdout.splitlines()[0])
    gpu = answers["spconv.pytorch:gpu-code"]
    assert "error" not in gpu and len(gpu["us"]) == 3 and min(gpu["us"]) > 0
    assert min(gpu["kernel_us"]) > 0  # the kernels ran and their time was taken out
    cpu = answers["spconv.pytorch"]
    assert "error" not in cpu and len(cpu["us"]) == 3 and cpu["kernel_us"] == [0, 0, 0]


def test_inference_keeps_the_dense_filters_while_the_weight_stays(hip_cpu):
    """On the fused route a layer without a gradient reuses its dense filters (one launch: the kernel); an in-place
    update, a new parameter or a dtype change of the weight is seen; pickling the layer carries nothing extra."""
    import io
    from spconv import _backend
    from support.launch_counts import count
    x = _scene()
    layer = _layers()[0]
    with _backend.gpu_code_on_cpu(hip_cpu.name), torch.no_grad():
        stored = layer(x).indice_dict
        cached = spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, 1, indice_dict=stored)
        layer(cached)
        kept = count(hip_cpu, lambda: layer(cached))
        with torch.enable_grad():
            made = count(hip_cpu, lambda: layer(cached))  # a gradient wanted: the differentiable layout each call
        assert kept["kernels"] == made["kernels"] == 1 and kept["aten"] == made["aten"] - 1, (kept, made)
        assert "aten::contiguous" not in kept["ops"] and "aten::contiguous" in made["ops"]
        for change in (lambda: layer.weight.mul_(0.5),
                       lambda: setattr(layer, "weight", torch.nn.Parameter(layer.weight * -1.5))):
            change()
            twin = _layers()[0]
            twin.load_state_dict(layer.state_dict())
            twin_out = twin(cached).features  # a layer that never ran: its filters made now
            assert torch.equal(layer(cached).features, twin_out)
        half = _scene()
        layer_h = layer.half()
        xs = spconv.SparseConvTensor(half.features.half(), half.indices, half.spatial_shape, 1)
        assert layer_h(xs).features.dtype == torch.float16
    torch.save(layer, io.BytesIO())
