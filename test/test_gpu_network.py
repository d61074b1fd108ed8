"""Whole networks on the GPU against the CPU route: the benchmark's basic network on the whole real scan
(125k voxels; a synthetic sweep of the same size when the file is absent) and the U-Net with inverse
convolutions, forward and backward, through the fused (default) and native (SPCONV_FORCE_NATIVE) GPU routes.
FP32 against the CPU route in FP32; FP16 and BF16 against the CPU route in FP64."""
import copy
import os

import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from spconv.benchmark import scenes
from test_end_to_end import UNet, _scene
from test_hip_cpu_network import FP16_TOL, REAL_SCAN, basic_net, flat, rel, run

pytestmark = pytest.mark.skipif(not (torch.cuda.is_available() and _backend.has_gpu_kernels()),
                                reason="needs a GPU and an extension built with GPU kernels")

# Relative to the norm, like the HIP CPU runtime's network tests. BF16 keeps 8 significant bits to FP16's 11.
TOL = {torch.float32: 1e-4, torch.float16: FP16_TOL, torch.bfloat16: 8 * FP16_TOL}
ROUTE_OPS = {False: {"spconv::build_fused_map", "spconv::fused_conv", "spconv::fused_conv_dfilter"},
             True: {"spconv::indice_conv", "spconv::indice_conv_backward"}}


def whole_scan():
    if os.path.isfile(REAL_SCAN):
        feats, idx, shape = scenes.load_voxels_npz(REAL_SCAN)
    else:
        feats, idx, shape = scenes.lidar_voxels(125000)
    return spconv.SparseConvTensor(torch.from_numpy(feats), torch.from_numpy(idx), shape, 1)


def case(name):
    """(network in FP32, input on the CPU)."""
    if name == "basic_scan":
        x = whole_scan()
        return basic_net(x.features.shape[1]), x
    torch.manual_seed(0)
    x, _, _ = _scene(1, batch_size=2, shape=(41, 64, 64), n_objects=8)
    return UNet(4, 3).eval(), x  # running statistics: the same affine map on both devices


def on(net, x, device, dtype):
    net = copy.deepcopy(net).to(device=device, dtype=dtype)
    return net, spconv.SparseConvTensor(x.features.to(device=device, dtype=dtype), x.indices.to(device),
                                        x.spatial_shape, x.batch_size)


def gpu_run(net, x, dtype, force_native):
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            res = run(*on(net, x, "cuda", dtype))
            torch.cuda.synchronize()
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    ran = {e.name for e in prof.events()}
    assert ROUTE_OPS[force_native] <= ran, sorted(n for n in ran if n.startswith("spconv"))
    return [t.cpu() for t in flat(res)]


_REF = {}


def reference(name, dtype):
    key = (name, dtype)
    if key not in _REF:
        net, x = case(name)
        _REF[key] = flat(run(*on(net, x, "cpu", dtype)))
    return _REF[key]


@pytest.mark.parametrize("force_native", [False, True], ids=["fused", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", ["basic_scan", "unet"])
def test_network_gpu_vs_cpu(name, dtype, force_native):
    net, x = case(name)
    got = gpu_run(net, x, dtype, force_native)
    ref = reference(name, torch.float32 if dtype == torch.float32 else torch.float64)
    assert len(got) == len(ref)
    for i, (g, r) in enumerate(zip(got, ref)):
        assert g.dtype == dtype and g.shape == r.shape, i
        assert torch.isfinite(g).all(), i
        assert rel(g, r) < TOL[dtype], "item %d (0: output, 1: dinput, then dweights): relative error %g" % (
            i, rel(g, r))
