"""Whole networks through the GPU code against the CPU route, wherever the GPU code runs (``gpu_place``: the HIP
CPU build, and a GPU when there is one), forward and backward, through both GPU routes: fused (default) and
native (SPCONV_FORCE_NATIVE). The HIP CPU build (every GPU thread is a fiber there) runs the benchmark's ``basic``
network on a crop of a real scan and on a synthetic scan voxelized by PointToVoxel, and a small U-Net with inverse
convolutions, in FP32 against the CPU route in FP32; a GPU runs the basic network on the whole real scan (a
synthetic sweep of the same size without the file), the same with average pools, and a U-Net, in FP32/FP16/BF16
against the CPU route in FP64. Only on the HIP CPU build: FP16 through the emulated WMMA, MFMA and sm_80 bodies
(tools/hip_cpu_build.py variants), against FP64 and bit for bit against the SIMT body, and the HashTable class."""
import copy
import os

import numpy as np
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from spconv.benchmark import scenes
from spconv.benchmark.network import build_basic_net
from spconv.pytorch.utils import PointToVoxel
from conftest import hip_cpu_library
from support.nets import UNet, lidar_scene
from support.places import per_place

REAL_SCAN = os.environ.get("SPCONV_REAL_SCAN", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                          "lidar-voxels-125k.npz"))
MAX_VOXELS = 600  # the HIP CPU build's scenes: every GPU thread is a fiber there


def coord_key(indices):
    k = torch.zeros(indices.shape[0], dtype=torch.int64, device=indices.device)
    for c in range(indices.shape[1]):
        k = k * 4096 + indices[:, c].long()
    return k


def by_coordinate(out):
    """Output indices and features in coordinate order: rows are compared through their coordinates."""
    order = torch.argsort(coord_key(out.indices))
    return out.indices[order], out.features[order]


def run(net, x, seed=0):
    """Forward, then backward of a loss whose weights depend only on the output coordinates."""
    net.zero_grad()
    feats = x.features.clone().requires_grad_(True)
    out = net(spconv.SparseConvTensor(feats, x.indices, x.spatial_shape, x.batch_size))
    if isinstance(out, torch.Tensor):
        idx, f = x.indices, out
    else:
        idx, f = out.indices, out.features
    g = torch.sin(coord_key(idx).double() * 0.37 + seed).to(f.dtype)[:, None]
    (f * g).sum().backward()
    grads = {n: p.grad.clone() for n, p in net.named_parameters() if p.grad is not None}
    return out, feats.grad.clone(), grads


def rel(a, b):
    return (torch.linalg.norm(a.double() - b.double()) / max(torch.linalg.norm(b.double()).item(), 1e-30)).item()


def flat(res):
    """Output features (coordinate order), dinput and the parameter gradients, as one list."""
    out, dx, grads = res
    f = out if isinstance(out, torch.Tensor) else by_coordinate(out)[1]
    return [f, dx] + [grads[n] for n in sorted(grads)]


def out_indices(res):
    """The output coordinates in coordinate order (None for a dense output)."""
    out = res[0]
    return None if isinstance(out, torch.Tensor) else by_coordinate(out)[0].cpu()


def basic_net(cin):
    torch.manual_seed(0)
    return build_basic_net(spconv, cin).float()


# ---- the scenes: (network in FP32, input on the CPU) ----
def real_scan_crop():
    if not os.path.isfile(REAL_SCAN):
        pytest.skip("real scan %s not present (set SPCONV_REAL_SCAN)" % REAL_SCAN)
    feats, idx, _ = scenes.load_voxels_npz(REAL_SCAN)
    size = [64, 64, 64]  # six 2x2x2 pools of the basic network leave a 1^3 grid
    origin = scenes.crop_window(idx, size, seed=0)
    feats, idx, shape = scenes.crop(feats, idx, origin, size)
    rows = scenes.nearest_voxels(idx, MAX_VOXELS, centre=[s // 2 for s in size])
    idx = idx[rows]
    idx[:, 0] = 0
    return spconv.SparseConvTensor(torch.from_numpy(feats[rows]), torch.from_numpy(idx), shape, 1)


def synthetic_scan_voxels():
    """A synthetic sweep voxelized by PointToVoxel through the selected op library (the GPU code inside
    gpu_code_on_cpu), cropped to the sensor's surroundings."""
    pts = scenes.synthetic_points(quick=True)
    near = np.abs(pts[:, :3]).max(1) < 6.0
    pc = torch.from_numpy(np.ascontiguousarray(pts[near][:, :3]))
    gen = PointToVoxel(vsize_xyz=[0.2, 0.2, 0.125], coors_range_xyz=[-6.4, -6.4, -2.0, 6.4, 6.4, 6.0],
                       num_point_features=3, max_num_voxels=MAX_VOXELS, max_num_points_per_voxel=4)
    voxels, indices, num = gen(pc)
    feats = voxels.sum(1) / num.clamp(min=1)[:, None].to(voxels.dtype)
    idx = torch.cat([torch.zeros(indices.shape[0], 1, dtype=torch.int32), indices.int()], 1)
    return spconv.SparseConvTensor(feats.contiguous(), idx, [64, 64, 64], 1), (voxels, indices, num)


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


def small_unet():
    torch.manual_seed(0)
    x, _, _ = lidar_scene(1, batch_size=1, shape=(17, 16, 16), n_objects=3)
    return UNet(4, 3).eval(), x  # BatchNorm with running statistics: the same affine map on every route


_SCENES = {}


def scene(place, name):
    """(network in FP32, input on the CPU), built once per name."""
    if name not in _SCENES:
        if name == "basic_crop":
            x = real_scan_crop()
            assert x.indices.shape[0] > 100
            net = basic_net(x.features.shape[1])
        elif name == "basic_synthetic":
            with place.active():
                x, gpu_vox = synthetic_scan_voxels()
            _, cpu_vox = synthetic_scan_voxels()
            for a, b in zip(gpu_vox, cpu_vox):  # voxelization through the Python layer, bit-exact
                assert torch.equal(a.cpu(), b)
            x = spconv.SparseConvTensor(x.features.cpu(), x.indices.cpu(), x.spatial_shape, x.batch_size)
            assert x.indices.shape[0] > 100
            net = basic_net(3)
        elif name == "unet_small":
            net, x = small_unet()
        elif name == "unet":
            torch.manual_seed(0)
            x, _, _ = lidar_scene(1, batch_size=2, shape=(41, 64, 64), n_objects=8)
            net = UNet(4, 3).eval()  # running statistics: the same affine map on both devices
        else:  # basic_scan, basic_scan_avg
            x = whole_scan()
            net = basic_net(x.features.shape[1])
            if name == "basic_scan_avg":
                for child, m in list(net.named_children()):
                    if isinstance(m, spconv.SparseMaxPool3d):
                        setattr(net, child, spconv.SparseAvgPool3d(2, 2))
            unit_gain(net, x)
        _SCENES[name] = net, x
    net, x = _SCENES[name]
    return copy.deepcopy(net), x


def on(net, x, device, dtype):
    net = copy.deepcopy(net).to(device=device, dtype=dtype)
    return net, spconv.SparseConvTensor(x.features.to(device=device, dtype=dtype), x.indices.to(device),
                                        x.spatial_shape, x.batch_size)


_REF = {}


def reference(name, net, x, dtype):
    """The CPU route's run in dtype: (output coordinates, items)."""
    key = (name, dtype)
    if key not in _REF:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            res = run(*on(net, x, "cpu", dtype))
        assert not any(e.name.startswith("spconv_hipcpu::") for e in prof.events())  # the CPU route alone
        _REF[key] = out_indices(res), flat(res)
    return _REF[key]


def gpu_run(place, net, x, dtype, force_native):
    """The network's run through one GPU route at the place: (output coordinates, items), on the CPU."""
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with place.active(), torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            assert _backend.fused_route_enabled(place.device) is not force_native
            res = run(*on(net, x, place.device, dtype))
            place.synchronize()
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    what = "native GPU route" if force_native else "fused GPU route"
    ran = {e.name for e in prof.events()}
    expect = ["strided_kernel_map"] + (["indice_conv", "indice_conv_backward"] if force_native else
                                       ["fused_conv", "fused_conv_backward"])
    assert {place.ops.name + "::" + op for op in expect} <= ran, (what, sorted(n for n in ran if "spconv" in n))
    if place.name == "hip_cpu":  # the GPU code's ops have their own namespace there
        assert not any(n.startswith("spconv::") for n in ran), what  # nothing fell back to the CPU route
    return out_indices(res), [t.cpu() for t in flat(res)]


# Relative to the norm. A GPU's whole scan: each item within TOL[dtype] of the CPU route in FP64, or within twice
# the CPU route's own error in the same dtype where that is larger (BF16 keeps 8 significant bits to FP16's 11;
# every layer rounds its output). Max pooling sends each gradient to the largest input: two inputs within
# rounding of each other can swap between two correct FP32 routes (on the whole scan: two rows 2.6e-6 apart,
# moving the gradients of the layers below by 2.4e-3), so the gradients of networks with max pools get FLIP_TOL;
# the same network with average pools checks every gradient to TOL. The HIP CPU build's small scenes have no such
# near ties: every item within SAME_TOL of the CPU route in FP32.
FP16_TOL = 5e-2  # every layer rounds its output to FP16: one op 2e-3, the basic network ~2e-2
TOL = {torch.float32: 1e-4, torch.float16: FP16_TOL, torch.bfloat16: 8 * FP16_TOL}
FLIP_TOL = 1e-2
SAME_TOL = 1e-4
ROUTES = {"fused": (False,), "native": (True,), "both": (False, True)}
GPU_CASES = [(name, dtype, route) for name in ("basic_scan", "basic_scan_avg", "unet")
             for dtype in (torch.float32, torch.float16, torch.bfloat16) for route in ("fused", "native")]
# (scene, dtype, routes, reference): "same" the CPU route in the same dtype to SAME_TOL, "fp64" the bounds above.
CASES = {
    "hip_cpu": [pytest.param("basic_crop", torch.float32, "both", "same", marks=pytest.mark.slow),
                pytest.param("basic_synthetic", torch.float32, "both", "same", marks=pytest.mark.slow),
                pytest.param("unet_small", torch.float32, "both", "same", marks=pytest.mark.slow)],
    "cuda": [(name, dtype, route, "fp64") for name, dtype, route in GPU_CASES],
}


@per_place("name,dtype,routes,against", CASES,
           ids=lambda name, dtype, routes, against: name if routes == "both" else "%s-%s-%s" % (name, dtype, routes))
def test_network_matches_cpu_route(gpu_place, name, dtype, routes, against):
    net, x = scene(gpu_place, name)
    ref_idx, ref = reference(name, net, x, dtype if against == "same" else torch.float64)
    _, same = reference(name, net, x, dtype)
    max_pools = any(isinstance(m, spconv.SparseMaxPool3d) for m in net.modules())
    for force_native in ROUTES[routes]:
        what = "native GPU route" if force_native else "fused GPU route"
        idx, got = gpu_run(gpu_place, net, x, dtype, force_native)
        assert (idx is None) == (ref_idx is None) and (idx is None or torch.equal(idx, ref_idx)), what
        assert len(got) == len(ref) == len(same)
        for i, (g, r, c) in enumerate(zip(got, ref, same)):
            assert g.dtype == dtype and g.shape == r.shape, (what, i)
            assert torch.isfinite(g).all(), (what, i)
            if against == "same":
                bound = SAME_TOL
            else:
                bound = max(TOL[dtype], 2 * rel(c, r), FLIP_TOL if max_pools and i > 0 else 0)
            assert rel(g, r) < bound, "%s item %d (0: output, 1: dinput, then dweights): relative error %g, " \
                "bound %g" % (what, i, rel(g, r), bound)


def test_empty_input_network(gpu_place):
    x = spconv.SparseConvTensor(torch.zeros(0, 4, device=gpu_place.device),
                                torch.zeros(0, 4, dtype=torch.int32, device=gpu_place.device), [17, 16, 16], 1)
    net = UNet(4, 3).eval().to(gpu_place.device)
    with gpu_place.active():
        out = net(x)
    assert out.shape == (0, 3)


def test_hash_table_class(hip_cpu):
    """spconv.pytorch.hash.HashTable (grown and rehashed on the CPU) over the GPU hash kernels. The HIP CPU build
    alone: a table on a GPU has a fixed capacity (test_hash.py)."""
    from spconv.pytorch.hash import HashTable
    g = torch.Generator().manual_seed(2)
    keys = torch.randint(0, 5000, (3000,), generator=g)
    values = torch.randint(-100, 100, (3000,), generator=g)
    query = torch.randint(0, 6000, (1000,), generator=g)

    def session():
        t = HashTable("cpu", torch.int64, torch.int64, max_size=100)
        t.insert(keys[:1000], values[:1000])
        t.insert(keys[1000:], values[1000:])  # grows: rehash through hash_table_insert
        q = t.query(query)
        e = t.insert_exist_keys(query, query * 2)
        k, v = t.items()[:2]
        order = torch.argsort(k)
        return q, e, k[order], v[order]

    with _backend.gpu_code_on_cpu(), torch.profiler.profile() as prof:
        got = session()
    assert "spconv_hipcpu::hash_table_insert" in {e.name for e in prof.events()}
    for a, b in zip(got, session()):  # against the CPU route
        for x, y in zip(a if isinstance(a, tuple) else (a,), b if isinstance(b, tuple) else (b,)):
            assert torch.equal(x, y)


# ---- FP16 through the emulated matrix-core bodies: the HIP CPU build's variants alone ----
def fp16_case(name):
    """(network, input) in FP32; the basic network on the real scan crop, or the U-Net."""
    if name == "basic_crop":
        x = real_scan_crop()
        return basic_net(x.features.shape[1]), x
    return small_unet()


def as_dtype(net, x, dtype):
    net = net.to(dtype)
    return net, spconv.SparseConvTensor(x.features.to(dtype), x.indices, x.spatial_shape, x.batch_size)


def run_through(variant, net, x):
    ops = hip_cpu_library(variant)
    with _backend.gpu_code_on_cpu(ops.name), torch.profiler.profile() as prof:
        assert ops.fused_conv_path(x.features) == variant
        res = run(net, x)
    ran = {e.name for e in prof.events()}
    assert {ops.name + "::fused_conv", ops.name + "::fused_conv_backward"} <= ran, variant
    assert not any(n.startswith("spconv::") for n in ran), variant  # nothing fell back to the CPU route
    return res


_SIMT = {}


@pytest.mark.slow
@pytest.mark.hip_cpu
@pytest.mark.parametrize("name", ["basic_crop", "unet"])
@pytest.mark.parametrize("variant", ["wmma", "mfma", "sm80"])
def test_network_fp16_emulated(variant, name):
    net, x = fp16_case(name)
    if name not in _SIMT:
        _SIMT[name] = flat(run_through("simt", *as_dtype(copy.deepcopy(net), x, torch.float16)))
    got = flat(run_through(variant, *as_dtype(copy.deepcopy(net), x, torch.float16)))
    assert _backend.ops.namespace == "spconv"
    ref = flat(run(*as_dtype(copy.deepcopy(net), x, torch.float64)))  # CPU route, FP64
    assert len(got) == len(ref) == len(_SIMT[name])
    for i, (g, r, s) in enumerate(zip(got, ref, _SIMT[name])):
        assert g.dtype == torch.float16 and torch.isfinite(g).all(), i
        assert rel(g, r) < FP16_TOL, "%s %s item %d: relative error %g" % (variant, name, i, rel(g, r))
        assert torch.equal(g.view(torch.int16), s.view(torch.int16)), "%s %s item %d differs from SIMT" % (
            variant, name, i)
