"""The GPU code's operators (csrc/ops/gpu glue, csrc/hip kernels) against the CPU route (torch.ops.spconv) on the
same inputs, wherever the GPU code runs (``gpu_place``: the HIP CPU build, every op in both thread orders of a
block, and a GPU when there is one): kernel maps, fused forward / dinput / dfilter and their tables, the native
GPU route, pooling over neighbour tables, voxelization and hash tables; on a GPU also the fused route's autograd
and the modules with the fused route on and off. The HIP CPU build takes small maps (every GPU thread is a fiber
there); a GPU adds larger ones."""
import contextlib

import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from spconv.pytorch import _route
from support.conv_cases import (FUSED_CPU_CASES, MAPS, TOL, Maps, as_maps, fused_inputs, map_geometry, native_backward,
                                native_f64, rel_err, sorted_pairs)
from support.places import in_both_orders, on_places, per_place

cpu = torch.ops.spconv

# Larger maps for a GPU.
BIG_MAPS = {
    # many tiles, realistic neighbour counts
    "subm_big": dict(shape=[40, 40, 40], batch=2, n=6000, ksize=3),
    # high sparsity: most rows have only the centre
    "subm_highsparse": dict(shape=[200, 200, 50], batch=1, n=3000, ksize=3),
    # regular sparsity: dense block
    "subm_regular": dict(shape=[16, 16, 16], batch=1, n=4096, ksize=3),
    # unique index: every input feeds exactly one output (kernel == stride)
    "conv_unique": dict(shape=[32, 32, 32], batch=1, n=3000, ksize=2, stride=2, subm=False),
    "conv_big": dict(shape=[41, 60, 60], batch=1, n=5000, ksize=3, stride=2, padding=1, subm=False),
}
# Each place's geometries by name: on a GPU also the fused CPU tests' (their sizes where a name is in both) and
# the larger ones.
GEOMETRIES = {"hip_cpu": MAPS, "cuda": dict(MAPS, **FUSED_CPU_CASES, **BIG_MAPS)}
GPU_MAP_CASES = sorted(dict(FUSED_CPU_CASES, **BIG_MAPS))  # the kernel-map cases of a GPU


def geometries(place):
    return GEOMETRIES[place.name]


def both_maps(place, name):
    """(indices, CPU result, GPU-code result) of get_indice_pairs for one geometry of the place; the GPU code's
    tensors stay where it made them (map_info, the host record, on the host)."""
    idx, args = map_geometry(**geometries(place)[name])
    return idx, cpu.get_indice_pairs(idx, *args), place.ops.get_indice_pairs(place.to(idx), *args)


def cpu_all(ts):
    return tuple(t.cpu() for t in ts)


def coord_keys(t):
    k = torch.zeros(t.shape[0], dtype=torch.int64)
    for c in range(t.shape[1]):
        k = k * 1024 + t[:, c].long()
    return k


# ---- kernel maps ----
@per_place("name", in_both_orders(sorted(MAPS), GPU_MAP_CASES), ids=str)
def test_kernel_map_pairs(gpu_place, name):
    idx, (c_out, c_pin, c_pout, c_poff, c_info, c_tab), got = both_maps(gpu_place, name)
    assert all(t.device.type == gpu_place.device.type for t in got[1:4])  # the pairs stay on the device
    g_out, g_pin, g_pout, g_poff, g_info, g_tab = cpu_all(got)
    assert torch.equal(g_poff, c_poff)
    assert torch.equal(g_info, c_info)  # host record: offsets, row counts, repeat-free flag
    assert g_out.shape == c_out.shape and g_out.dtype == c_out.dtype
    if geometries(gpu_place)[name].get("subm", True):
        # SubM: the outputs are the input rows; same pairs in the same order
        assert torch.equal(g_out, idx) and torch.equal(g_pin, c_pin) and torch.equal(g_pout, c_pout)
        assert torch.equal(g_tab, c_tab)  # the neighbour table the fused route takes as its forward table
        return
    # regular / transposed: same output coordinate set, same (input, output coordinate) pairs per offset
    ck, gk = coord_keys(c_out), coord_keys(g_out)
    assert torch.equal(torch.sort(ck).values, torch.sort(gk).values)
    a = sorted_pairs(c_pin, ck[c_pout.long()], c_poff)
    b = sorted_pairs(g_pin, gk[g_pout.long()], g_poff)
    for k, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), "offset %d" % k


@per_place("name", in_both_orders(["conv_s2", "deconv"], ["conv_s2", "deconv"]), ids=str)
def test_kernel_map_output_order(gpu_place, name):
    _, (c_out, c_pin, c_pout, *c_rest), got = both_maps(gpu_place, name)
    g_out, g_pin, g_pout, *g_rest = cpu_all(got)
    assert torch.equal(g_out, c_out) and torch.equal(g_pin, c_pin) and torch.equal(g_pout, c_pout)
    assert all(torch.equal(g, c) for g, c in zip(g_rest, c_rest))  # offsets, map_info, the table by input


@on_places()
def test_kernel_map_errors_and_empty(gpu_place):
    ops, on = gpu_place.ops, gpu_place.to
    dup = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="row 2 repeats"):
        ops.get_indice_pairs(on(dup), 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    with pytest.raises(ValueError):
        bad = torch.tensor([[0, 9, 1, 1]], dtype=torch.int32)
        ops.get_indice_pairs(on(bad), 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    empty = torch.zeros(0, 4, dtype=torch.int32)
    for subm, out_shape, stride in ((True, [4, 4, 4], 1), (False, [2, 2, 2], 2)):
        res = ops.get_indice_pairs(on(empty), 1, [4, 4, 4], out_shape, [3] * 3, [stride] * 3, [1] * 3, [1] * 3,
                                   subm, False)
        ref = cpu.get_indice_pairs(empty, 1, [4, 4, 4], out_shape, [3] * 3, [stride] * 3, [1] * 3, [1] * 3, subm,
                                   False)
        for g, c in zip(cpu_all(res), ref):
            assert g.shape == c.shape and g.dtype == c.dtype and torch.equal(g, c)


# ---- fused route: tables, forward, dinput, dfilter ----
def on_device(place, m):
    """The map m's pairs where the place's GPU code runs."""
    return Maps(place.to(m.pair_in), place.to(m.pair_out), place.to(m.pair_offsets), m.num_in, m.num_out)


TABLE_MAPS = ["subm3", "subm5_kvol125", "conv_s2", "deconv", "subm2d_k12"]


@pytest.mark.parametrize("splits", [1, 2, 3])
@per_place("name", in_both_orders(TABLE_MAPS, TABLE_MAPS), ids=str)
def test_fused_tables_match_cpu(gpu_place, name, splits):
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    s = min(splits, m.pair_offsets.numel() - 1)
    md = on_device(gpu_place, m)
    for (pin, pout, rows), (dpin, dpout) in zip(((m.pair_in, m.pair_out, m.num_out), (m.pair_out, m.pair_in, m.num_in)),
                                                ((md.pair_in, md.pair_out), (md.pair_out, md.pair_in))):
        g = gpu_place.ops.build_fused_map(dpin, dpout, md.pair_offsets, rows, s)
        c = cpu.build_fused_map(pin, pout, m.pair_offsets, rows, s)
        for a, b in zip(g, c):
            assert torch.equal(a.cpu(), b)


DTYPE_IDS = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64"}
# (map, cin, cout): Cin > 32 (several K steps), Cin > 64 (dfilter row tiles), Cout > 64 (several column
# tiles), channel counts multiples of 8 (vector loads) and not; kernel volumes 1, 8, 27, 125
FUSED_CASES = [
    ("subm3", 16, 32), ("subm3", 40, 72), ("subm3", 13, 70), ("subm_dense", 72, 24), ("subm_k1", 24, 16),
    ("subm5_kvol125", 8, 16), ("conv_k2s2", 33, 65), ("conv_s2", 64, 64), ("deconv", 24, 40),
    ("subm2d_k12", 5, 7),
]
# A GPU: the larger maps and the fused CPU tests' in three channel pairs each, splits 1 and 2.
GPU_FUSED_CASES = [(s, (name, cin, cout)) for s in (1, 2)
                   for name in ["subm_big", "subm_highsparse", "subm_regular", "conv_unique", "conv_big", "deconv",
                                "subm5_kvol125", "subm_k12", "subm_sparse"]
                   for cin, cout in ((16, 32), (64, 64), (13, 70))]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@per_place("splits,case", in_both_orders([(s, c) for s in (1, 2, 3) for c in FUSED_CASES], GPU_FUSED_CASES),
           ids=lambda s, c: "%d-%s-%dx%d" % ((s,) + c))
def test_fused_forward_dinput_dfilter(gpu_place, splits, case, dtype):
    name, cin, cout = case
    if dtype != torch.float32 and splits == 3:
        pytest.skip("low precision: splits 1 and 2 suffice")
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    kvol = m.pair_offsets.numel() - 1
    s = min(splits, kvol)
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    ops, on, md = gpu_place.ops, gpu_place.to, on_device(gpu_place, m)
    y = ops.fused_conv(on(x), on(w), *ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, s))
    rev = ops.build_fused_map(md.pair_out, md.pair_in, md.pair_offsets, m.num_in, s)
    dx = ops.fused_conv(on(dy), on(w.transpose(1, 2).contiguous()), *rev)
    dw = ops.fused_conv_dfilter(on(x), on(dy), md.pair_in, md.pair_out, md.pair_offsets)
    y, dx, dw = cpu_all((y, dx, dw))
    assert y.dtype == dx.dtype == dw.dtype == dtype
    if dtype == torch.float32:  # against the CPU route in fp32, on the same inputs
        ref = (cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out),
               *cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets))
    else:  # against an fp64 reference of the same (rounded) inputs
        ref = native_f64(x, w, dy, m)
    for what, got, r in zip(("forward", "dinput", "dfilter"), (y, dx, dw), ref):
        assert got.shape == r.shape, what
        assert rel_err(got, r) < TOL[dtype], "%s: relative error %g" % (what, rel_err(got, r))


# The pipelined sm_80 bodies on a GPU (SPCONV_FUSED_SM80=1; WMMA is the default there): the tensor cores' own
# order of additions, so a bound against FP64 and against the default body, not bits. On the HIP CPU build the
# sm80 variant gives the SIMT body's bits (test_hip_cpu_variants.py).
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
@per_place("splits,case", {"cuda": [(s, c) for s in (1, 2) for c in (
    ("subm_big", 64, 64), ("subm_big", 13, 70), ("subm_big", 40, 72), ("subm_big", 140, 12), ("subm_big", 256, 256),
    ("conv_big", 128, 128), ("subm_highsparse", 96, 96), ("deconv", 24, 40))]},
    ids=lambda s, c: "%d-%s-%dx%d" % ((s,) + c))
def test_fused_pipelined_body(gpu_place, splits, case, dtype, monkeypatch):
    name, cin, cout = case
    if torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the pipelined bodies need sm_80 or later")
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    s = min(splits, m.pair_offsets.numel() - 1)
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    ops, on, md = gpu_place.ops, gpu_place.to, on_device(gpu_place, m)
    fwd = ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, s)
    rev = ops.build_fused_map(md.pair_out, md.pair_in, md.pair_offsets, m.num_in, s)
    wt = on(w.transpose(1, 2).contiguous())

    def run():
        return cpu_all((ops.fused_conv(on(x), on(w), *fwd), ops.fused_conv(on(dy), wt, *rev),
                        ops.fused_conv_dfilter(on(x), on(dy), md.pair_in, md.pair_out, md.pair_offsets)))

    monkeypatch.setenv("SPCONV_FUSED_SM80", "0")
    default = run()
    monkeypatch.setenv("SPCONV_FUSED_SM80", "1")
    assert ops.fused_conv_path(on(x)) == "sm80"
    got = run()
    assert all(torch.equal(a, b) for a, b in zip(got, run())), "the pipelined bodies are deterministic"
    for what, g, d, r in zip(("forward", "dinput", "dfilter"), got, default, native_f64(x, w, dy, m)):
        assert g.dtype == dtype and g.shape == r.shape, what
        assert rel_err(g, r) < TOL[dtype], "%s: relative error %g against FP64" % (what, rel_err(g, r))
        assert rel_err(g, d.to(r.dtype)) < TOL[dtype], "%s: relative difference %g from the default body" % (
            what, rel_err(g, d.to(r.dtype)))


# The TF32 bodies on a GPU (FP32 with TF32 allowed; NVIDIA sm_80+): within TF32's rounding of FP64. On the HIP CPU
# build the emulated WMMA variant gives the SIMT body's bits on inputs rounded to TF32 (test_hip_cpu_variants.py).
@per_place("splits,case", {"cuda": [(s, c) for s in (1, 2) for c in (
    ("subm_big", 64, 64), ("subm_big", 13, 70), ("subm_big", 128, 128), ("conv_big", 64, 96), ("deconv", 24, 40))]},
    ids=lambda s, c: "%d-%s-%dx%d" % ((s,) + c))
def test_fused_tf32_body(gpu_place, splits, case):
    name, cin, cout = case
    if not torch.version.cuda or torch.cuda.get_device_capability()[0] < 8:
        pytest.skip("the TF32 bodies need NVIDIA sm_80 or later")
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    s = min(splits, m.pair_offsets.numel() - 1)
    x, w, dy = fused_inputs(m, cin, cout, torch.float32)
    ops, on, md = gpu_place.ops, gpu_place.to, on_device(gpu_place, m)
    assert ops.fused_conv_path(on(x), True) == "tf32" and ops.fused_conv_path(on(x)) == "simt"
    fwd = ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, s)
    rev = ops.build_fused_map(md.pair_out, md.pair_in, md.pair_offsets, m.num_in, s)
    got = cpu_all((ops.fused_conv(on(x), on(w), *fwd, tf32=True),
                   ops.fused_conv(on(dy), on(w.transpose(1, 2).contiguous()), *rev, tf32=True),
                   ops.fused_conv_dfilter(on(x), on(dy), md.pair_in, md.pair_out, md.pair_offsets, tf32=True)))
    for what, g, r in zip(("forward", "dinput", "dfilter"), got, native_f64(x, w, dy, m)):
        assert g.dtype == torch.float32 and g.shape == r.shape, what
        assert rel_err(g, r) < 3e-3, "%s: relative error %g against FP64" % (what, rel_err(g, r))


@on_places()
def test_fused_dfilter_split_k(gpu_place):
    """Enough pairs per offset (> 4096) for the glue to split K into several workspace chunks."""
    idx, args = map_geometry(shape=[24, 24, 24], batch=1, n=9000, ksize=1)
    res = cpu.get_indice_pairs(idx, *args)
    m = as_maps(res, idx.shape[0])
    x, _, dy = fused_inputs(m, 8, 8, torch.float32)
    md, on = on_device(gpu_place, m), gpu_place.to
    got = gpu_place.ops.fused_conv_dfilter(on(x), on(dy), md.pair_in, md.pair_out, md.pair_offsets).cpu()
    ref = cpu.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    assert rel_err(got, ref) < 1e-5


@per_place("name,cin,cout,dtype,splits", in_both_orders(
    [("subm3", 40, 72, torch.float16, 2)], [("subm_big", 64, 64, dt, 1) for dt in DTYPE_IDS if dt != torch.float64]),
    ids=lambda name, cin, cout, dtype, splits: "" if name == "subm3" else "%s-%s" % (name, DTYPE_IDS[dtype]))
def test_fused_deterministic(gpu_place, name, cin, cout, dtype, splits):
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    x, w, dy = (gpu_place.to(t) for t in fused_inputs(m, cin, cout, dtype))
    ops, md = gpu_place.ops, on_device(gpu_place, m)
    t = ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, splits)
    assert torch.equal(ops.fused_conv(x, w, *t), ops.fused_conv(x, w, *t))
    a = ops.fused_conv_dfilter(x, dy, md.pair_in, md.pair_out, md.pair_offsets)
    assert torch.equal(a, ops.fused_conv_dfilter(x, dy, md.pair_in, md.pair_out, md.pair_offsets))


@on_places()
def test_fused_empty_and_path(gpu_place, monkeypatch):
    ops, dev = gpu_place.ops, gpu_place.device
    z = torch.zeros(0, dtype=torch.int32, device=dev)
    poff = torch.zeros(28, dtype=torch.int64, device=dev)
    nbr, masks, order = ops.build_fused_map(z, z, poff, 6, 1)
    y = ops.fused_conv(torch.randn(0, 8, device=dev), torch.randn(27, 8, 4, device=dev), nbr, masks, order)
    assert y.shape == (6, 4) and torch.all(y == 0)
    n0, m0, o0 = ops.build_fused_map(z, z, poff, 0, 1)
    assert ops.fused_conv(torch.randn(0, 8, device=dev), torch.randn(27, 8, 4, device=dev), n0, m0, o0).shape == (0, 4)
    dw = ops.fused_conv_dfilter(torch.randn(0, 8, device=dev), torch.randn(0, 4, device=dev), z, z, poff)
    assert dw.shape == (27, 8, 4) and torch.all(dw == 0)
    e = ops.indice_conv(torch.randn(0, 8, device=dev), torch.randn(27, 8, 4, device=dev), z, z, poff, 5)
    assert e.shape == (5, 4) and torch.all(e == 0)
    path = {dt: ops.fused_conv_path(torch.zeros(1, dtype=dt, device=dev))
            for dt in (torch.float32, torch.float16, torch.bfloat16)}
    assert path[torch.float32] == "simt"
    if gpu_place.name == "hip_cpu":
        assert set(path.values()) == {"simt"}  # no matrix cores on the host
    elif torch.version.cuda:
        sm80 = torch.cuda.get_device_capability()[0] >= 8
        assert path[torch.float16] == ("wmma" if sm80 else "simt")
        monkeypatch.setenv("SPCONV_FUSED_SM80", "1")  # the pipelined bodies on request, read at each launch
        assert ops.fused_conv_path(torch.zeros(1, dtype=torch.float16, device=dev)) == ("sm80" if sm80 else "simt")


# The HIP CPU build runs the fused route's autograd in the modules' and networks' tests (test_gpu_code_network.py)
# at its sizes; here a GPU's larger maps.
@per_place("name", {"cuda": ["conv_big"]}, ids=str)
def test_fused_autograd_and_cache(gpu_place, name):
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    md, dev = on_device(gpu_place, m), gpu_place.device
    x = torch.randn(m.num_in, 32, device=dev, requires_grad=True)
    w = torch.randn(27, 32, 48, device=dev, requires_grad=True)
    with gpu_place.active():
        y = _route.fused_conv(x, w, md, m.num_out)
        assert y is not None
        dy = torch.randn_like(y)
        y.backward(dy)
        assert any(k.startswith("fused_map_s") for k in md.cache)
        assert _route.fused_conv(x.double(), w.double(), md, m.num_out) is None  # fp64 -> native
    dx_ref, dw_ref = native_backward(x.detach().cpu().double(), w.detach().cpu().double(), dy.cpu().double(), m)
    torch.testing.assert_close(x.grad.cpu().double(), dx_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.cpu().double(), dw_ref, rtol=1e-4, atol=1e-3)


# ---- through the modules, fused route on and off (the HIP CPU build: the networks of test_gpu_code_network.py) ----
def _modules_net():
    torch.manual_seed(0)
    return spconv.SparseSequential(
        spconv.SubMConv3d(16, 32, 3, indice_key="s1", bias=False),
        spconv.SparseConv3d(32, 64, 3, stride=2, padding=1, indice_key="d1", bias=False),
        spconv.SubMConv3d(64, 64, 3, indice_key="s2", bias=False),
        spconv.SparseInverseConv3d(64, 32, 3, indice_key="d1", bias=False),
        spconv.SparseConvTranspose3d(32, 16, 3, stride=1, padding=1, bias=False),
    )


@per_place("dtype", {"cuda": [torch.float32, torch.float16]}, ids=lambda dt: DTYPE_IDS[dt])
def test_modules_fused_vs_native_vs_cpu(gpu_place, dtype, monkeypatch):
    idx = torch.unique(torch.randint(0, 24, (3000, 3)), dim=0)
    idx = torch.cat([torch.zeros(idx.shape[0], 1, dtype=idx.dtype), idx], 1).int()
    feats = torch.randn(idx.shape[0], 16)
    results = {}
    for name, place, force in (("cpu", None, True), ("native", gpu_place, True), ("fused", gpu_place, False)):
        monkeypatch.setattr(constants, "SPCONV_FORCE_NATIVE", force)
        dev, dt = (torch.device("cpu"), torch.float32) if place is None else (place.device, dtype)
        net = _modules_net().to(device=dev, dtype=dt)
        # detach(): on the CPU .to() returns feats itself, which must not start requiring grad
        f = feats.to(device=dev, dtype=dt).detach().requires_grad_()
        with place.active() if place is not None else contextlib.nullcontext():
            y = net(spconv.SparseConvTensor(f, idx.to(dev), [24, 24, 24], 1))
            d = y.dense()
            d.float().square().sum().backward()
        results[name] = (d.detach().float().cpu(), f.grad.detach().float().cpu(),
                         [p.grad.detach().float().cpu() for p in net.parameters()])
    ref = results["cpu"]
    for name in ("native", "fused"):
        out, dx, dws = results[name]
        if dtype == torch.float32:
            torch.testing.assert_close(out, ref[0], rtol=1e-3, atol=1e-3)
            torch.testing.assert_close(dx, ref[1], rtol=1e-3, atol=1e-3)
            for a, b in zip(dws, ref[2]):
                torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-2)
        else:
            rel = torch.linalg.norm(out - ref[0]) / torch.linalg.norm(ref[0])
            assert rel < 2e-2, (name, rel)


# ---- native GPU route: gather -> GEMM -> sum by position ----
NATIVE_CASES = [("subm3", 40, 72), ("conv_s2", 13, 24), ("deconv", 8, 16), ("subm_k1", 5, 3)]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["f32", "f64", "f16", "bf16"])
@per_place("name,cin,cout", in_both_orders(NATIVE_CASES, NATIVE_CASES), ids=lambda n, i, o: "%s-%d-%d" % (n, i, o))
def test_native_route(gpu_place, name, cin, cout, dtype):
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    ops, on, md = gpu_place.ops, gpu_place.to, on_device(gpu_place, m)
    y = ops.indice_conv(on(x), on(w), md.pair_in, md.pair_out, md.pair_offsets, m.num_out)
    dx, dw = ops.indice_conv_backward(on(x), on(w), on(dy), md.pair_in, md.pair_out, md.pair_offsets)
    if dtype in (torch.float32, torch.float64):
        ref = (cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out),
               *cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets))
    else:
        ref = native_f64(x, w, dy, m)
    tol = 1e-12 if dtype == torch.float64 else TOL[dtype]
    for what, got, r in zip(("forward", "dinput", "dfilter"), cpu_all((y, dx, dw)), ref):
        assert got.dtype == dtype and got.shape == r.shape, what
        assert rel_err(got, r) < tol, "%s: relative error %g" % (what, rel_err(got, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@on_places()
def test_native_route_chunks_same_bits(gpu_place, dtype):
    """The native route gathers every pair at once, or runs of whole offsets where the buffers would be large,
    and sums each row's products in offset order either way: the same bits, forward, dinput and dfilter."""
    idx, res, _ = both_maps(gpu_place, "subm3")
    m = as_maps(res, idx.shape[0])
    x, w, dy = (gpu_place.to(t) for t in fused_inputs(m, 24, 40, dtype))
    ops, md = gpu_place.ops, on_device(gpu_place, m)
    debug = _backend.debug_library(ops)

    def run():
        return (ops.indice_conv(x, w, md.pair_in, md.pair_out, md.pair_offsets, m.num_out),
                *ops.indice_conv_backward(x, w, dy, md.pair_in, md.pair_out, md.pair_offsets))

    whole = run()
    old = debug.debug_native_chunk_rows(1)  # chunks of the fewest whole offsets that hold the largest one
    try:
        chunked = run()
    finally:
        debug.debug_native_chunk_rows(old)
    for what, a, b in zip(("forward", "dinput", "dfilter"), whole, chunked):
        assert torch.equal(a, b), what


@per_place("name", in_both_orders(["subm3", "conv_s2"], ["subm3", "conv_s2"]), ids=str)
def test_pair_positions_table(gpu_place, name):
    """pair_positions (GPU code and CPU op): the index within its offset of the pair writing each (row, offset),
    -1 where none; rows outside [0, num_dst) are skipped."""
    idx, res, _ = both_maps(gpu_place, name)
    m = as_maps(res, idx.shape[0])
    ops, md = gpu_place.ops, on_device(gpu_place, m)
    po = m.pair_offsets.tolist()
    kvol = len(po) - 1
    for dst, ddst, rows in ((m.pair_out, md.pair_out, m.num_out), (m.pair_in, md.pair_in, m.num_in)):
        want = torch.full((rows, kvol), -1, dtype=torch.int32)
        for k in range(kvol):
            for j, r in enumerate(dst[po[k]:po[k + 1]].tolist()):
                want[r, k] = j
        assert torch.equal(ops.pair_positions(ddst, md.pair_offsets, rows).cpu(), want)
        assert torch.equal(cpu.pair_positions(dst, m.pair_offsets, rows), want)
    short = m.num_out // 2  # rows past it are skipped, not written out of bounds
    full = cpu.pair_positions(m.pair_out, m.pair_offsets, m.num_out)
    assert torch.equal(ops.pair_positions(md.pair_out, md.pair_offsets, short).cpu(), full[:short])
    assert torch.equal(cpu.pair_positions(m.pair_out, m.pair_offsets, short), full[:short])
    with pytest.raises(TypeError, match="pair_dst must be int32"):
        ops.pair_positions(md.pair_out.long(), md.pair_offsets, m.num_out)
    with pytest.raises(ValueError, match="num_dst must be >= 0"):
        cpu.pair_positions(m.pair_out, m.pair_offsets, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
@on_places()
def test_native_route_given_positions_and_strided_filters(gpu_place, dtype):
    """The map's position tables passed in (as the layers pass them, made once per map) give the bits of the
    tables the op makes itself; filters read in place through the weight's permutation give those of contiguous
    ones; a table of the wrong shape is refused by name, and one of another map is bounded, not read past its
    offsets."""
    idx, res, _ = both_maps(gpu_place, "subm3")
    m = as_maps(res, idx.shape[0])
    x, w, dy = (gpu_place.to(t) for t in fused_inputs(m, 24, 40, dtype))
    ops, md = gpu_place.ops, on_device(gpu_place, m)
    args = (md.pair_in, md.pair_out, md.pair_offsets)
    out_pos = ops.pair_positions(md.pair_out, md.pair_offsets, m.num_out)
    in_pos = ops.pair_positions(md.pair_in, md.pair_offsets, m.num_in)
    want = (ops.indice_conv(x, w, *args, m.num_out), *ops.indice_conv_backward(x, w, dy, *args))
    got = (ops.indice_conv(x, w, *args, m.num_out, None, out_pos, in_pos),
           *ops.indice_conv_backward(x, w, dy, *args, None, in_pos))
    w_view = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # [kvol, Cin, Cout] over a [Cout, kvol, Cin] weight
    assert not w_view.is_contiguous()
    strided = (ops.indice_conv(x, w_view, *args, m.num_out), *ops.indice_conv_backward(x, w_view, dy, *args))
    for what, a, b, c in zip(("forward", "dinput", "dfilter"), want, got, strided):
        assert torch.equal(a, b), what
        assert torch.allclose(a.float(), c.float(), rtol=1e-3 if dtype == torch.float16 else 1e-5, atol=1e-3), what
    with pytest.raises(ValueError, match=r"out_positions must be a contiguous \["):
        ops.indice_conv(x, w, *args, m.num_out, None, out_pos[:-1])
    with pytest.raises(ValueError, match=r"in_positions must be a contiguous \["):
        ops.indice_conv_backward(x, w, dy, *args, None, out_pos.t())
    with pytest.raises(TypeError, match="out_positions must be int32"):
        ops.indice_conv(x, w, *args, m.num_out, None, out_pos.long())
    garbage = gpu_place.to(torch.randint(-3, 1 << 20, out_pos.shape, dtype=torch.int32))
    assert torch.isfinite(ops.indice_conv(x, w, *args, m.num_out, None, garbage).float()).all()


# ---- pooling: the pair ops against the CPU route are in test_pool_gpu_code.py (every place of the GPU code) ----


# ---- pooling over neighbour tables (one launch per op): the CPU route's bits on the same map ----
def pool_tables(place, name, res, num_in):
    """(nbr, nbr_t) of a map built by the GPU code: the builder's table and its transpose
    (transpose_neighbour_table), where the GPU code made them."""
    out_idx, info, table = res[0], res[4], res[5]
    if geometries(place)[name].get("subm", True):
        return table, place.ops.transpose_neighbour_table(table, num_in, info)
    return place.ops.transpose_neighbour_table(table, out_idx.shape[0], info), table


def pool_features(n, channels, dtype, seed=3):
    """Random features with ties (halves), all-negative rows, and exact +0 / -0 entries: the cases that decide
    which input takes a max pool's gradient."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, generator=g)
    x[::3] = torch.round(x[::3] * 2) / 2
    x[1::4] = -x[1::4].abs() - 0.25
    x[2::9] = 0.0
    x[5::11] = -0.0
    return x.to(dtype)


POOL_MAPS = ["conv_k2s2", "conv_s2", "subm3", "conv4d", "subm5_kvol125", "subm2d_k12"]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("channels", [3, 33])
@per_place("name", in_both_orders(POOL_MAPS, POOL_MAPS), ids=str)
def test_pooling_tables_bit_exact(gpu_place, name, channels, dtype):
    idx, _, res = both_maps(gpu_place, name)
    info = res[4]
    out_idx, pin, pout, poff = cpu_all(res[:4])
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    nbr, nbr_t = pool_tables(gpu_place, name, res, n_in)
    x = pool_features(n_in, channels, dtype)
    dy = torch.randn(n_out, channels, generator=torch.Generator().manual_seed(4)).to(dtype)
    ops, on = gpu_place.ops, gpu_place.to
    yc = cpu.indice_maxpool(x, pin, pout, poff, n_out)
    dxc = cpu.indice_maxpool_backward(x, yc, dy, pin, pout, poff)
    ac, cntc = cpu.indice_avgpool(x, pin, pout, poff, n_out)
    dac = cpu.indice_avgpool_backward(dy, cntc, pin, pout, poff, n_in)
    assert (yc == 0).any() and (dxc == 0).any()  # clamped windows and inputs without gradient exist
    for map_info in (info, None):  # trusted host record; checked on the device
        y, arg = ops.indice_maxpool_table(on(x), nbr, nbr_t, map_info)
        assert y.dtype == dtype and torch.equal(y.cpu(), yc)
        assert arg.shape == y.shape and arg.dtype == (torch.uint8 if nbr.shape[1] < 255 else torch.int32)
        dx = ops.indice_maxpool_table_backward(on(dy), arg, nbr_t, map_info)
        assert dx.dtype == dtype and torch.equal(dx.cpu(), dxc)
        a, cnt = ops.indice_avgpool_table(on(x), nbr, nbr_t, map_info)
        assert torch.equal(cnt.cpu(), cntc) and a.dtype == dtype and torch.equal(a.cpu(), ac)
        da = ops.indice_avgpool_table_backward(on(dy), cnt, nbr_t, map_info)
        assert da.dtype == dtype and torch.equal(da.cpu(), dac)


@on_places()
def test_pooling_tables_ties_take_the_first_offset(gpu_place):
    """Equal inputs in a window: the gradient goes to the first offset in ascending order, never two."""
    idx, _, res = both_maps(gpu_place, "conv_k2s2")
    n_in, n_out = idx.shape[0], res[0].shape[0]
    nbr, nbr_t = pool_tables(gpu_place, "conv_k2s2", res, n_in)
    x = torch.full((n_in, 2), 1.5)
    x[:, 1] = -1.0  # every window all negative: output 0, no gradient
    dy = torch.ones(n_out, 2)
    ops, on = gpu_place.ops, gpu_place.to
    y, arg = ops.indice_maxpool_table(on(x), nbr, nbr_t)
    y, arg_cpu, nbr_cpu = y.cpu(), arg.cpu(), nbr.cpu()
    assert torch.equal(y[:, 0], torch.full((n_out,), 1.5)) and torch.equal(y[:, 1], torch.zeros(n_out))
    first = torch.where(nbr_cpu >= 0, torch.arange(nbr_cpu.shape[1]), nbr_cpu.shape[1]).min(1).values
    assert torch.equal(arg_cpu[:, 0].long(), first) and (arg_cpu[:, 1] == 255).all()
    dx = ops.indice_maxpool_table_backward(on(dy), arg, nbr_t).cpu()
    assert dx[:, 0].sum() == n_out and torch.equal(dx[:, 1], torch.zeros(n_in))
    winners = torch.zeros(n_in)
    winners[nbr_cpu[torch.arange(n_out), first].long()] = 1
    assert torch.equal(dx[:, 0], winners)


@on_places()
def test_pooling_tables_nan(gpu_place):
    idx, _, res = both_maps(gpu_place, "conv_s2")
    info = res[4]
    out_idx, pin, pout, poff = cpu_all(res[:4])
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    nbr, nbr_t = pool_tables(gpu_place, "conv_s2", res, n_in)
    x = pool_features(n_in, 4, torch.float32)
    x[::5, 1] = float("nan")
    x[3] = float("nan")
    dy = torch.randn(n_out, 4, generator=torch.Generator().manual_seed(2))
    ops, on = gpu_place.ops, gpu_place.to
    y, arg = ops.indice_maxpool_table(on(x), nbr, nbr_t, info)
    yc = cpu.indice_maxpool(x, pin, pout, poff, n_out)
    assert torch.isnan(y.cpu()).any() and torch.equal(torch.isnan(y.cpu()), torch.isnan(yc))
    assert torch.equal(y.cpu().nan_to_num(), yc.nan_to_num())
    dx = ops.indice_maxpool_table_backward(on(dy), arg, nbr_t, info)
    assert torch.equal(dx.cpu(), cpu.indice_maxpool_backward(x, yc, dy, pin, pout, poff))


@on_places()
def test_pooling_tables_int8(gpu_place):
    idx, _, res = both_maps(gpu_place, "conv_s2")
    info = res[4]
    out_idx, pin, pout, poff = cpu_all(res[:4])
    nbr, nbr_t = pool_tables(gpu_place, "conv_s2", res, idx.shape[0])
    x = torch.randint(-128, 128, (idx.shape[0], 9), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    y, arg = gpu_place.ops.indice_maxpool_table(gpu_place.to(x), nbr, nbr_t, info)
    assert y.dtype == torch.int8 and arg.shape == (0, 9)  # inference only: no argmax
    assert torch.equal(y.cpu(), cpu.indice_maxpool(x, pin, pout, poff, out_idx.shape[0]))


@on_places()
def test_pooling_tables_empty(gpu_place):
    ops, on = gpu_place.ops, gpu_place.to
    none = torch.full((3, 8), -1, dtype=torch.int32)
    no_rows = torch.zeros(0, 8, dtype=torch.int32)
    z = torch.zeros(0, dtype=torch.int32)
    poff = torch.zeros(9, dtype=torch.int64)
    x = torch.randn(0, 4)
    y, arg = ops.indice_maxpool_table(on(x), on(none), on(no_rows))
    assert torch.equal(y.cpu(), cpu.indice_maxpool(x, z, z, poff, 3)) and arg.shape == (0, 4)
    a, cnt = ops.indice_avgpool_table(on(x), on(none), on(no_rows))
    ac, cntc = cpu.indice_avgpool(x, z, z, poff, 3)
    assert torch.equal(a.cpu(), ac) and torch.equal(cnt.cpu(), cntc)
    assert ops.indice_maxpool_table_backward(on(torch.randn(3, 4)), arg, on(no_rows)).shape == (0, 4)
    assert ops.indice_avgpool_table_backward(on(torch.randn(3, 4)), cnt, on(no_rows)).shape == (0, 4)
    # inputs feeding nothing get a zero gradient; zero channels still count
    nothing = on(torch.full((5, 8), -1, dtype=torch.int32))
    y, arg = ops.indice_maxpool_table(on(torch.randn(5, 4)), on(none), nothing)
    assert torch.equal(y.cpu(), torch.zeros(3, 4)) and (arg.cpu() == 255).all()
    dx = ops.indice_maxpool_table_backward(on(torch.randn(3, 4)), arg, nothing)
    assert torch.equal(dx.cpu(), torch.zeros(5, 4))
    idx, _, res = both_maps(gpu_place, "conv_s2")
    nbr, nbr_t = pool_tables(gpu_place, "conv_s2", res, idx.shape[0])
    a, cnt = ops.indice_avgpool_table(on(torch.randn(idx.shape[0], 0)), nbr, nbr_t)
    assert a.shape == (nbr.shape[0], 0) and torch.equal(cnt.cpu(), (nbr.cpu() >= 0).sum(1).int())


@on_places()
def test_pooling_transpose_table(gpu_place):
    idx, _, res = both_maps(gpu_place, "conv_s2")
    out_idx, pin, pout, poff, info, table = res
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    ops = gpu_place.ops
    nbr = ops.transpose_neighbour_table(table, n_out, info)
    by_output = cpu.build_fused_map(pin.cpu(), pout.cpu(), poff.cpu(), n_out, 1)[0]
    assert torch.equal(nbr.cpu(), by_output)  # the table by output of the pairs
    assert torch.equal(ops.transpose_neighbour_table(nbr, n_in).cpu(), table.cpu())  # checked on the device, same
    bad = table.clone()
    bad[0, 0] = n_out
    with pytest.raises(ValueError, match="outside"):
        ops.transpose_neighbour_table(bad, n_out)
    twice = gpu_place.to(torch.tensor([[0, -1], [0, 1]], dtype=torch.int32))
    with pytest.raises(ValueError, match="twice"):
        ops.transpose_neighbour_table(twice, 2)
    with pytest.raises(ValueError, match="map_info"):
        ops.transpose_neighbour_table(table, n_out - 1, info)


# ---- voxelization: bit-exact ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("empty_mean", [False, True])
@pytest.mark.parametrize("max_voxels,max_points", [(10000, 5), (40, 3)])
@on_places()
def test_point_to_voxel_bit_exact(gpu_place, dtype, empty_mean, max_voxels, max_points):
    g = torch.Generator().manual_seed(5)
    pts = (torch.rand(700, 4, generator=g) * torch.tensor([8.0, 6.0, 4.0, 1.0]) - 0.5).to(dtype)
    args = ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 2.0, 3.0, 4.0], [4, 6, 8], max_voxels, max_points, empty_mean)
    ops = gpu_place.ops
    for got, ref in zip(ops.point_to_voxel(gpu_place.to(pts), *args), cpu.point_to_voxel(pts, *args)):
        assert got.dtype == ref.dtype and torch.equal(got.cpu(), ref)
    for got, ref in zip(ops.point_to_voxel(gpu_place.to(pts[:0]), *args), cpu.point_to_voxel(pts[:0], *args)):
        assert got.shape == ref.shape and got.dtype == ref.dtype


# ---- hash table ----
@pytest.mark.parametrize("key_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("value_dtype", [torch.int32, torch.int64, torch.float32])
@on_places()
def test_hash_table_ops(gpu_place, key_dtype, value_dtype):
    g = torch.Generator().manual_seed(11)
    cap = 512
    empty = torch.iinfo(key_dtype).max
    keys = torch.randint(0, 300, (200,), generator=g).to(key_dtype)  # repeats: first occurrence wins
    values = torch.randint(-50, 50, (200,), generator=g).to(value_dtype)
    query = torch.randint(0, 400, (150,), generator=g).to(key_dtype)
    upd = torch.randint(0, 400, (80,), generator=g).to(key_dtype)
    upd_v = torch.randint(-9, 9, (80,), generator=g).to(value_dtype)
    tables = []
    for ops, on in ((gpu_place.ops, gpu_place.to), (cpu, lambda t: t)):
        tk = on(torch.full((cap,), empty, dtype=key_dtype))
        tv = on(torch.zeros(cap, dtype=value_dtype))
        ops.hash_table_insert(tk, tv, on(keys), on(values))
        ops.hash_table_insert(tk, tv, on(keys[:10] + 1000), None)
        q = ops.hash_table_query(tk, tv, on(query))
        e = ops.hash_table_insert_exist_keys(tk, tv, on(upd), on(upd_v))
        q2 = ops.hash_table_query(tk, tv, on(torch.cat([query, upd])))
        tables.append((cpu_all(q), e.cpu(), cpu_all(q2), tk.cpu(), tv.cpu()))
    (q, e, q2, tk, tv), (qc, ec, q2c, tkc, tvc) = tables
    assert torch.equal(q[0], qc[0]) and torch.equal(q[1], qc[1])
    assert torch.equal(e, ec)
    assert torch.equal(q2[0], q2c[0]) and torch.equal(q2[1], q2c[1])
    # slots may differ (probing order is an implementation detail); the stored mapping must not
    def mapping(k, v):
        keep = k != empty
        order = torch.argsort(k[keep])
        return k[keep][order], v[keep][order]
    for a, b in zip(mapping(tk, tv), mapping(tkc, tvc)):
        assert torch.equal(a, b)
