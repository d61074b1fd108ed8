"""Whole networks through the GPU code on the CPU (HIP CPU runtime; spconv._backend.gpu_code_on_cpu): the
benchmark's ``basic`` network on a crop of a real scan and on a synthetic scan (voxelized by PointToVoxel),
and a U-Net with inverse convolutions, forward and backward, against the CPU route on the same inputs. Both
GPU routes run: fused (default) and native (SPCONV_FORCE_NATIVE). In FP16 the same networks also run through
the emulated WMMA and MFMA bodies (tools/hip_cpu_build.py variants), against FP64 and bit for bit against
the SIMT body."""
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
from test_end_to_end import UNet, _scene

pytestmark = pytest.mark.hip_cpu

REAL_SCAN = os.environ.get("SPCONV_REAL_SCAN", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                          "lidar-voxels-125k.npz"))
MAX_VOXELS = 600  # every GPU thread is a fiber: keep the scenes small


def coord_key(indices):
    k = torch.zeros(indices.shape[0], dtype=torch.int64, device=indices.device)
    for c in range(indices.shape[1]):
        k = k * 4096 + indices[:, c].long()
    return k


def by_coordinate(out):
    """Output features in coordinate order: the GPU numbers pooled outputs by sorted key, the CPU by first
    appearance, so rows are compared through their coordinates."""
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


def compare(net, x, tol=1e-4):
    assert _backend.ops.namespace == "spconv"
    with torch.profiler.profile() as prof:
        ref_out, ref_dx, ref_grads = run(net, x)  # CPU route
    assert not any(e.name.startswith("spconv_hipcpu::") for e in prof.events())
    for force_native in (False, True):
        old = constants.SPCONV_FORCE_NATIVE
        constants.SPCONV_FORCE_NATIVE = force_native
        try:
            with _backend.gpu_code_on_cpu(), torch.profiler.profile() as prof:
                assert _backend.fused_route_enabled(torch.device("cpu")) is not force_native
                out, dx, grads = run(net, x)
        finally:
            constants.SPCONV_FORCE_NATIVE = old
        what = "native GPU route" if force_native else "fused GPU route"
        ran = {e.name for e in prof.events()}
        expect = ["get_indice_pairs"] + (["indice_conv", "indice_conv_backward"] if force_native else
                                         ["fused_conv", "fused_conv_backward"])
        assert {"spconv_hipcpu::" + op for op in expect} <= ran, (what, sorted(n for n in ran if "spconv" in n))
        assert not any(n.startswith("spconv::") for n in ran), what  # nothing fell back to the CPU route
        if isinstance(out, torch.Tensor):
            assert rel(out, ref_out) < tol, what
        else:
            (gi, gf), (ri, rf) = by_coordinate(out), by_coordinate(ref_out)
            assert torch.equal(gi, ri), what
            assert rel(gf, rf) < tol, "%s: output relative error %g" % (what, rel(gf, rf))
        assert rel(dx, ref_dx) < tol, "%s: dinput relative error %g" % (what, rel(dx, ref_dx))
        assert grads.keys() == ref_grads.keys()
        for n in grads:
            assert rel(grads[n], ref_grads[n]) < tol, "%s: d%s relative error %g" % (what, n, rel(grads[n],
                                                                                                 ref_grads[n]))


def basic_net(cin):
    torch.manual_seed(0)
    return build_basic_net(spconv, cin).float()


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


@pytest.mark.slow
def test_basic_net_real_scan(hip_cpu):
    x = real_scan_crop()
    assert x.indices.shape[0] > 100
    compare(basic_net(x.features.shape[1]), x)


def synthetic_scan_voxels():
    """A synthetic sweep voxelized by PointToVoxel through the selected op library (GPU code inside
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


@pytest.mark.slow
def test_basic_net_synthetic_scan(hip_cpu):
    with _backend.gpu_code_on_cpu():
        x, gpu_vox = synthetic_scan_voxels()
    _, cpu_vox = synthetic_scan_voxels()
    for a, b in zip(gpu_vox, cpu_vox):  # voxelization through the Python layer, bit-exact
        assert torch.equal(a, b)
    assert x.indices.shape[0] > 100
    compare(basic_net(3), x)


@pytest.mark.slow
def test_unet_inverse_convs(hip_cpu):
    torch.manual_seed(0)
    x, _, _ = _scene(1, batch_size=1, shape=(17, 16, 16), n_objects=3)
    net = UNet(4, 3)
    net.eval()  # BatchNorm with running statistics: the same affine map on both routes
    compare(net, x)


def test_empty_input_network(hip_cpu):
    x = spconv.SparseConvTensor(torch.zeros(0, 4), torch.zeros(0, 4, dtype=torch.int32), [17, 16, 16], 1)
    net = UNet(4, 3).eval()
    with _backend.gpu_code_on_cpu():
        out = net(x)
    assert out.shape == (0, 3)


def test_hash_table_class(hip_cpu):
    """spconv.pytorch.hash.HashTable (grown and rehashed on the CPU) over the GPU hash kernels."""
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


# ---- FP16 through the emulated matrix-core bodies ----
# Relative to the norm. Every layer rounds its output to FP16, so the error grows with depth (one op: 2e-3;
# the basic network: ~2e-2); the bit-for-bit comparison with the SIMT body is the sharp check.
FP16_TOL = 5e-2


def fp16_case(name):
    """(network, input) in FP32; the basic network on the real scan crop, or the U-Net."""
    if name == "basic_crop":
        x = real_scan_crop()
        return basic_net(x.features.shape[1]), x
    torch.manual_seed(0)
    x, _, _ = _scene(1, batch_size=1, shape=(17, 16, 16), n_objects=3)
    return UNet(4, 3).eval(), x


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


def flat(res):
    """Output features (coordinate order), dinput and the parameter gradients, as one list."""
    out, dx, grads = res
    f = out if isinstance(out, torch.Tensor) else by_coordinate(out)[1]
    return [f, dx] + [grads[n] for n in sorted(grads)]


_SIMT = {}


@pytest.mark.slow
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
