"""Whole networks on the GPU against the CPU route: the benchmark's basic network on the whole real scan
(125k voxels; a synthetic sweep of the same size when the file is absent), the same with average pools, and
the U-Net with inverse convolutions, forward and backward, through the fused (default) and native
(SPCONV_FORCE_NATIVE) GPU routes, FP32/FP16/BF16, against the CPU route in FP64."""
import copy
import os

import pytest
import torch

import spconv.pytorch as spconv
from spconv import constants
from spconv.benchmark import scenes
from test_end_to_end import UNet, _scene
from test_gpu_code_network import FP16_TOL, REAL_SCAN, basic_net, flat, rel, run

pytestmark = pytest.mark.gpu  # skipped without a GPU (conftest)

# Relative to the norm. Each item must be within TOL[dtype] of the CPU route in FP64, or within twice the CPU
# route's own error in the same dtype where that is larger (BF16 keeps 8 significant bits to FP16's 11; every
# layer rounds its output). Max pooling sends each gradient to the largest input: two inputs within rounding of
# each other can swap between two correct FP32 routes (on the whole scan: two rows 2.6e-6 apart, moving the
# gradients of the layers below by 2.4e-3), so the gradients of networks with max pools get FLIP_TOL; the same
# network with average pools checks every gradient to TOL.
TOL = {torch.float32: 1e-4, torch.float16: FP16_TOL, torch.bfloat16: 8 * FP16_TOL}
FLIP_TOL = 1e-2
ROUTE_OPS = {False: {"spconv::fused_conv", "spconv::fused_conv_backward"},
             True: {"spconv::indice_conv", "spconv::indice_conv_backward"}}
CASES = ["basic_scan", "basic_scan_avg", "unet"]


def whole_scan():
    if os.path.isfile(REAL_SCAN):
        feats, idx, shape = scenes.load_voxels_npz(REAL_SCAN)
    else:
        feats, idx, shape = scenes.lidar_voxels(125000)
    return spconv.SparseConvTensor(torch.from_numpy(feats), torch.from_numpy(idx), shape, 1)


def unit_gain(net, x):
    """Scales each conv's weight so its output has the RMS of its input (on the CPU, in FP32): without it the
    14 layers shrink the signal by ~1e-8 and FP16 gradients underflow."""
    with torch.no_grad():
        h = x
        for m in net:
            y = m(h)
            if isinstance(m, spconv.SubMConv3d):
                m.weight.mul_(h.features.square().mean().sqrt() / y.features.square().mean().sqrt())
                y = m(h)
            h = y
    return net


_CASES = {}


def case(name):
    """(network in FP32, input on the CPU), built once."""
    if name not in _CASES:
        if name == "unet":
            torch.manual_seed(0)
            x, _, _ = _scene(1, batch_size=2, shape=(41, 64, 64), n_objects=8)
            net = UNet(4, 3).eval()  # running statistics: the same affine map on both devices
        else:
            x = whole_scan()
            net = basic_net(x.features.shape[1])
            if name == "basic_scan_avg":
                for child, m in list(net.named_children()):
                    if isinstance(m, spconv.SparseMaxPool3d):
                        setattr(net, child, spconv.SparseAvgPool3d(2, 2))
            unit_gain(net, x)
        _CASES[name] = net, x
    net, x = _CASES[name]
    return copy.deepcopy(net), x


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
    """The CPU route's items in dtype."""
    key = (name, dtype)
    if key not in _REF:
        net, x = case(name)
        _REF[key] = flat(run(*on(net, x, "cpu", dtype)))
    return _REF[key]


@pytest.mark.parametrize("force_native", [False, True], ids=["fused", "native"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("name", CASES)
def test_network_gpu_vs_cpu(name, dtype, force_native):
    net, x = case(name)
    got = gpu_run(net, x, dtype, force_native)
    ref, same = reference(name, torch.float64), reference(name, dtype)
    assert len(got) == len(ref) == len(same)
    max_pools = any(isinstance(m, spconv.SparseMaxPool3d) for m in net.modules())
    for i, (g, r, c) in enumerate(zip(got, ref, same)):
        assert g.dtype == dtype and g.shape == r.shape, i
        assert torch.isfinite(g).all(), i
        bound = max(TOL[dtype], 2 * rel(c, r), FLIP_TOL if max_pools and i > 0 else 0)
        assert rel(g, r) < bound, "item %d (0: output, 1: dinput, then dweights): relative error %g, bound %g" % (
            i, rel(g, r), bound)
