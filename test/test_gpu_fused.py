"""GPU route tests: kernel maps (GPU vs CPU), fused vs native vs CPU reference for forward, dinput and
dfilter, FP32/FP16/BF16, SubM / regular / transposed / inverse, empty inputs, determinism, and the module
path with the fused route on and off. Skips where no GPU (or no GPU kernels) is present."""
import pytest
import torch

from spconv import _backend, constants
from spconv.pytorch import _fused, _route
from test_fused_cpu import CASES, Maps, make_map, native, native_backward, sorted_pairs

pytestmark = pytest.mark.skipif(
    not (torch.cuda.is_available() and _backend.has_gpu_kernels()),
    reason="needs a GPU and an extension built with GPU kernels")

ops = torch.ops.spconv
DEV = "cuda"

GPU_CASES = dict(CASES)
GPU_CASES.update({
    # many tiles, realistic neighbour counts
    "subm_big": dict(shape=[40, 40, 40], batch=2, n=6000, ksize=3),
    # high sparsity: most rows have only the centre
    "subm_highsparse": dict(shape=[200, 200, 50], batch=1, n=3000, ksize=3),
    # regular sparsity: dense block
    "subm_regular": dict(shape=[16, 16, 16], batch=1, n=4096, ksize=3),
    # unique index: every input feeds exactly one output (kernel == stride)
    "conv_unique": dict(shape=[32, 32, 32], batch=1, n=3000, ksize=2, stride=2, subm=False),
    "conv_big": dict(shape=[41, 60, 60], batch=1, n=5000, ksize=3, stride=2, padding=1, subm=False),
})


def to_dev(m):
    return Maps(m.pair_in.to(DEV), m.pair_out.to(DEV), m.pair_offsets.to(DEV), m.num_in, m.num_out)


def gpu_map(case):
    spec = dict(GPU_CASES[case])
    idx, out_idx, m_cpu = make_map(**spec)
    nd = len(spec["shape"])
    ks, st, pd, dl = ([spec.get(k, d)] * nd if isinstance(spec.get(k, d), int) else list(spec.get(k, d))
                      for k, d in (("ksize", 3), ("stride", 1), ("padding", 0), ("dilation", 1)))
    subm, transpose = spec.get("subm", True), spec.get("transpose", False)
    out_shape = list(spec["shape"]) if subm else None
    if not subm:
        # recover the output shape the CPU helper used
        if transpose:
            out_shape = [(s - 1) * t - 2 * p + d * (k - 1) + 1 for s, k, t, p, d in zip(spec["shape"], ks, st, pd, dl)]
        else:
            out_shape = [(s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(spec["shape"], ks, st, pd, dl)]
    res = ops.get_indice_pairs(idx.to(DEV), spec["batch"], list(spec["shape"]), out_shape, ks, st, pd, dl, subm,
                               transpose)
    return idx, out_idx, m_cpu, res


# ---- kernel maps ----
@pytest.mark.parametrize("case", sorted(GPU_CASES))
def test_kernel_map_matches_cpu(case):
    idx, out_idx, m, (g_out, g_pin, g_pout, g_poff, g_info, _) = gpu_map(case)
    assert g_pin.device.type == g_pout.device.type == g_poff.device.type == torch.device(DEV).type
    assert torch.equal(g_poff.cpu(), m.pair_offsets)
    if GPU_CASES[case].get("subm", True):
        # SubM: rows are the input rows; same pairs in the same order
        assert torch.equal(g_out.cpu(), idx)
        assert torch.equal(g_pin.cpu(), m.pair_in) and torch.equal(g_pout.cpu(), m.pair_out)
        return
    # regular / transposed: same output coordinates (any order), same pairs through the coordinates
    g_out = g_out.cpu()
    assert g_out.shape == out_idx.shape
    key = lambda t: t.long()[:, 0] * (1 << 48) + t.long()[:, 1] * (1 << 32) + t.long()[:, 2] * (1 << 16) + \
        t.long()[:, 3]
    assert torch.equal(torch.sort(key(g_out)).values, torch.sort(key(out_idx)).values)
    cpu_keys, gpu_keys = key(out_idx), key(g_out)
    a = sorted_pairs(m.pair_in, cpu_keys[m.pair_out.long()], m.pair_offsets)
    b = sorted_pairs(g_pin.cpu(), gpu_keys[g_pout.cpu().long()], g_poff.cpu())
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_kernel_map_duplicate_and_empty():
    idx = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="row 2 repeats"):
        ops.get_indice_pairs(idx.to(DEV), 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    with pytest.raises(ValueError):
        bad = torch.tensor([[0, 9, 1, 1]], dtype=torch.int32, device=DEV)
        ops.get_indice_pairs(bad, 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    empty = torch.zeros(0, 4, dtype=torch.int32, device=DEV)
    for subm in (True, False):
        out, pin, pout, poff, _, _ = ops.get_indice_pairs(empty, 1, [4, 4, 4], [2, 2, 2], [3] * 3, [2] * 3, [1] * 3,
                                                    [1] * 3, subm, False) if not subm else ops.get_indice_pairs(
            empty, 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
        assert out.shape[0] == 0 and pin.numel() == 0 and poff.shape == (28,) and int(poff[-1]) == 0


# ---- fused vs native vs CPU ----
def check(got, ref, dtype, cin, cout, what):
    got = got.float().cpu()
    ref = ref.float().cpu()
    assert got.shape == ref.shape, what
    if dtype == torch.float32:
        torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4, msg=what)
    else:
        err = torch.linalg.norm(got - ref).item()
        assert err < 10 * max(1, max(cin, cout) / 16), f"{what}: norm(diff) = {err}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("channels", [(16, 32), (64, 64), (13, 70)])
@pytest.mark.parametrize("case", ["subm_big", "subm_highsparse", "subm_regular", "conv_unique", "conv_big",
                                  "deconv", "subm5_kvol125", "subm_k12", "subm_sparse"])
@pytest.mark.parametrize("splits", [1, 2])
def test_fused_native_cpu_agree(case, channels, dtype, splits):
    cin, cout = channels
    _, _, m, _ = gpu_map(case)
    kvol = m.pair_offsets.numel() - 1
    g = torch.Generator().manual_seed(7)
    x = torch.randn(m.num_in, cin, generator=g).to(dtype)
    w = (torch.randn(kvol, cin, cout, generator=g) / (cin * 3) ** 0.5).to(dtype)
    dy = torch.randn(m.num_out, cout, generator=g).to(dtype)
    # CPU float64 reference from the same (rounded) inputs
    xr, wr, dyr = x.double(), w.double(), dy.double()
    y_ref = native(xr, wr, m)
    dx_ref, dw_ref = native_backward(xr, wr, dyr, m)
    md = to_dev(m)
    xd, wd, dyd = x.to(DEV), w.to(DEV), dy.to(DEV)
    nbr, masks, order = ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, min(splits, kvol))
    # the GPU tables equal the CPU reference tables
    c_nbr, c_masks, c_order = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, min(splits, kvol))
    assert torch.equal(nbr.cpu(), c_nbr) and torch.equal(masks.cpu(), c_masks) and torch.equal(order.cpu(), c_order)
    y_fused = ops.fused_conv(xd, wd, nbr, masks, order)
    y_native = ops.indice_conv(xd, wd, md.pair_in, md.pair_out, md.pair_offsets, m.num_out)
    check(y_fused, y_ref, dtype, cin, cout, "fused forward")
    check(y_native, y_ref, dtype, cin, cout, "native forward")
    rn, rm, ro = ops.build_fused_map(md.pair_out, md.pair_in, md.pair_offsets, m.num_in, min(splits, kvol))
    dx_fused = ops.fused_conv(dyd, wd.transpose(1, 2).contiguous(), rn, rm, ro)
    dw_fused = ops.fused_conv_dfilter(xd, dyd, md.pair_in, md.pair_out, md.pair_offsets)
    dx_native, dw_native = ops.indice_conv_backward(xd, wd, dyd, md.pair_in, md.pair_out, md.pair_offsets)
    check(dx_fused, dx_ref, dtype, cin, cout, "fused dinput")
    check(dx_native, dx_ref, dtype, cin, cout, "native dinput")
    # dfilter sums over all pairs of an offset: compare relative to its scale
    scale = max(1.0, dw_ref.abs().max().item() / 8)
    check(dw_fused / scale, dw_ref / scale, dtype, cin, cout, "fused dfilter")
    check(dw_native / scale, dw_ref / scale, dtype, cin, cout, "native dfilter")
    # the CPU reference of the fused op agrees with the GPU kernel
    if dtype == torch.float32:
        torch.testing.assert_close(y_fused.cpu(), ops.fused_conv(x, w, c_nbr, c_masks, c_order), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_fused_deterministic(dtype):
    _, _, m, _ = gpu_map("subm_big")
    md = to_dev(m)
    x = torch.randn(m.num_in, 64, device=DEV).to(dtype)
    w = torch.randn(27, 64, 64, device=DEV).to(dtype) / 20
    dy = torch.randn(m.num_out, 64, device=DEV).to(dtype)
    t = ops.build_fused_map(md.pair_in, md.pair_out, md.pair_offsets, m.num_out, 1)
    assert torch.equal(ops.fused_conv(x, w, *t), ops.fused_conv(x, w, *t))
    a = ops.fused_conv_dfilter(x, dy, md.pair_in, md.pair_out, md.pair_offsets)
    b = ops.fused_conv_dfilter(x, dy, md.pair_in, md.pair_out, md.pair_offsets)
    assert torch.equal(a, b)


def test_fused_empty_and_path():
    z = torch.zeros(0, dtype=torch.int32, device=DEV)
    poff = torch.zeros(28, dtype=torch.int64, device=DEV)
    nbr, masks, order = ops.build_fused_map(z, z, poff, 6, 1)
    y = ops.fused_conv(torch.randn(0, 8, device=DEV), torch.randn(27, 8, 4, device=DEV), nbr, masks, order)
    assert y.shape == (6, 4) and torch.all(y == 0)
    n0, m0, o0 = ops.build_fused_map(z, z, poff, 0, 1)
    assert ops.fused_conv(torch.randn(0, 8, device=DEV), torch.randn(27, 8, 4, device=DEV), n0, m0, o0).shape == (0, 4)
    dw = ops.fused_conv_dfilter(torch.randn(0, 8, device=DEV), torch.randn(0, 4, device=DEV), z, z, poff)
    assert dw.shape == (27, 8, 4) and torch.all(dw == 0)
    e = ops.indice_conv(torch.randn(0, 8, device=DEV), torch.randn(27, 8, 4, device=DEV), z, z, poff, 5)
    assert e.shape == (5, 4) and torch.all(e == 0)
    path = ops.fused_conv_path(torch.zeros(1, device=DEV, dtype=torch.float16))
    major = torch.cuda.get_device_capability()[0] if torch.version.cuda else 0
    if torch.version.cuda:
        assert path == ("wmma" if major >= 8 else "simt")
    assert ops.fused_conv_path(torch.zeros(1, device=DEV)) == "simt"


def test_fused_autograd_and_cache():
    _, _, m, _ = gpu_map("conv_big")
    md = to_dev(m)
    x = torch.randn(m.num_in, 32, device=DEV, requires_grad=True)
    w = torch.randn(27, 32, 48, device=DEV, requires_grad=True)
    y = _route.fused_conv(x, w, md, m.num_out)
    assert y is not None
    dy = torch.randn_like(y)
    y.backward(dy)
    assert any(k.startswith("fused_map_s") for k in md.cache)
    dx_ref, dw_ref = native_backward(x.detach().cpu().double(), w.detach().cpu().double(), dy.cpu().double(), m)
    torch.testing.assert_close(x.grad.cpu().double(), dx_ref, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad.cpu().double(), dw_ref, rtol=1e-4, atol=1e-3)
    assert _route.fused_conv(x.double(), w.double(), md, m.num_out) is None  # fp64 -> native


# ---- through the modules, fused route on and off ----
def _modules_run(dtype, force_native, monkeypatch):
    import spconv.pytorch as spconv
    monkeypatch.setattr(constants, "SPCONV_FORCE_NATIVE", force_native)
    torch.manual_seed(0)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(16, 32, 3, indice_key="s1", bias=False),
        spconv.SparseConv3d(32, 64, 3, stride=2, padding=1, indice_key="d1", bias=False),
        spconv.SubMConv3d(64, 64, 3, indice_key="s2", bias=False),
        spconv.SparseInverseConv3d(64, 32, 3, indice_key="d1", bias=False),
        spconv.SparseConvTranspose3d(32, 16, 3, stride=1, padding=1, bias=False),
    )
    return net


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_modules_fused_vs_native_vs_cpu(dtype, monkeypatch):
    import spconv.pytorch as spconv
    idx = torch.unique(torch.randint(0, 24, (3000, 3)), dim=0)
    idx = torch.cat([torch.zeros(idx.shape[0], 1, dtype=idx.dtype), idx], 1).int()
    feats = torch.randn(idx.shape[0], 16)
    results = {}
    for name, dev, force in (("cpu", "cpu", True), ("native", DEV, True), ("fused", DEV, False)):
        net = _modules_run(dtype, force, monkeypatch).to(dev)
        if dev != "cpu":
            net = net.to(dtype)
        # detach(): on the CPU .to() returns feats itself, which must not start requiring grad
        f = feats.to(dev).to(dtype if dev != "cpu" else torch.float32).detach().requires_grad_()
        x = spconv.SparseConvTensor(f, idx.to(dev), [24, 24, 24], 1)
        y = net(x)
        d = y.dense()
        d.float().square().sum().backward() if dev == "cpu" else d.float().square().sum().backward()
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
