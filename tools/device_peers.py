"""Times the project against spconv 2.3.8 and spconv-Triton on the same GPU, the same tensors, in one call.

    python3 tools/device_peers.py --device cuda [--peers .peers] [--json FILE]
    python3 tools/device_peers.py --device cpu --dry-run --json FILE      (ours only, tiny sizes; CI)

The inputs (real-scan slabs, the scan replicated to 1M voxels with shifted copies as spconv's bench_large does,
the device check's synthetic 50k scene, features, weights' seeds) are made once and saved to one file; each
library loads that file. The project and spconv-Triton (``spconv_triton.pytorch``, from ``<peers>/triton``)
run in this process; spconv 2.3.8 (the package name ``spconv`` again) in a child process whose path holds
``<peers>/site`` and not the project. Every library runs the same case code through its ``spconv.pytorch``-style
module (the API is the same), times with CUDA events (host clock on the CPU), warms every shape first (spconv
tunes its GEMMs on first use) and reports medians. A library that cannot run a case gets null there.

Output: bench/results/<UTC date>-device-<gpu>.json (or --json):
    {"gpu": ..., "commit": ..., "cases": [{"name", "ours_ms", "spconv238_ms", "spconv_triton_ms", "ours_sm80_ms"}],
     "notes": [...]}
and the table with ratios, printed last. ``ours_sm80_ms``: the project with its pipelined sm_80 bodies
(SPCONV_FUSED_SM80=1; WMMA is the default on NVIDIA GPUs until they have run on one), on the 16-bit cases only
(null elsewhere), timed after the peers so that they keep their share of the budget.

Standalone on purpose: only the parent imports the project (the child loads spconv/benchmark/network.py by path).
"""
import argparse
import datetime
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBS = ("ours", "spconv238", "spconv_triton", "ours_sm80")
KEYS = {"ours": "ours_ms", "spconv238": "spconv238_ms", "spconv_triton": "spconv_triton_ms", "ours_sm80": "ours_sm80_ms"}


def sm80_case(name: str) -> bool:
    """The cases whose layers run 16-bit fused convolutions: those the pipelined bodies change."""
    return "fp16" in name or "amp" in name
CASES = ("subm_map_50k", "subm_map_1m", "strided_map_50k", "maxpool_28k", "subm_cached_212", "basic_fp16_fwd",
         "basic_fp16_fwdbwd", "backbone8x_amp_train_step", "subm_c256_fp16_fwd", "subm_c256_fp16_bwd",
         "subm_c128_fp16_fwd", "subm_c64_fp16_fwd")
MAP_CHANNELS = 16  # map cases: a 16-channel layer on a fresh tensor, so the kernel map built in the call dominates
SCENE_SHAPE = [41, 1600, 1408]


# ---------------------------------------------------------------- inputs (made once, saved, loaded by every library)
def nearest(idx: np.ndarray, n: int) -> np.ndarray:
    """The n voxels nearest the grid centre (a real scan's sensor): a contiguous slab keeps its structure."""
    zyx = idx[:, 1:].astype(np.float64)
    d = np.square(zyx - zyx.max(0) / 2).sum(1)
    return idx[np.sort(np.argsort(d, kind="stable")[:n])]


def _keys(c: np.ndarray, shape) -> np.ndarray:
    return (c[:, 0].astype(np.int64) * shape[1] + c[:, 1]) * shape[2] + c[:, 2]


def _unique(keys: np.ndarray) -> np.ndarray:
    """Sorted distinct keys (a sort: numpy's hashing np.unique is many times slower on millions of keys)."""
    k = np.sort(keys)
    return k[np.concatenate([[True], k[1:] != k[:-1]])] if len(k) else k


def _coords(keys: np.ndarray, shape) -> np.ndarray:
    z, rem = np.divmod(keys, int(shape[1]) * int(shape[2]))
    y, x = np.divmod(rem, int(shape[2]))
    return np.stack([np.zeros_like(z), z, y, x], 1).astype(np.int32)


def replicate(idx: np.ndarray, shape, copies: int, shift: int):
    """bench_large's input: the scan stacked ``copies`` times, copy k shifted by k * shift voxels along y (copies
    overlap where the shift is short: repeated voxels merge, as voxelizing the stacked points does)."""
    out_shape = [shape[0], shape[1] + (copies - 1) * shift, shape[2]]
    zyx = idx[:, 1:].astype(np.int64)
    keys = np.concatenate([_keys(zyx + np.array([0, k * shift, 0]), out_shape) for k in range(copies)])
    return _coords(_unique(keys), out_shape), out_shape


def replicate_to(idx: np.ndarray, shape, n: int, shift: int = 10):
    """At least ``n`` voxels by replication (1 m shifts at 0.1 m voxels), then the ``n`` nearest the centre."""
    copies = 8
    big, big_shape = replicate(idx, shape, copies, shift)
    while len(big) < n and copies < 64:
        copies += 1
        big, big_shape = replicate(idx, shape, copies, shift)
    return nearest(big, n), big_shape


def pooled(idx: np.ndarray, shape, times: int):
    """Coordinates after ``times`` SparseMaxPool3d(2, 2): what the basic network's later stages see."""
    c, s = idx[:, 1:].astype(np.int64), np.asarray(shape)
    for _ in range(times):
        s = (s - 2) // 2 + 1
        c = c // 2
        c = c[(c < s).all(1)]
        c = _coords(_unique(_keys(c, s)), s)[:, 1:].astype(np.int64)
    return np.concatenate([np.zeros((len(c), 1), np.int64), c], 1).astype(np.int32), [int(v) for v in s]


def synthetic_scene(n_target: int, seed: int = 0) -> np.ndarray:
    """The device check's layer scene: LiDAR-like voxels on a 41x1600x1408 grid (ground pieces and vertical
    faces, 30% holes; about 6.5 pairs per voxel for a 3x3x3 SubM)."""
    rng = np.random.default_rng(seed)
    keys = np.zeros(0, np.int64)
    while keys.size < n_target:
        if rng.uniform() < 0.5:
            x0, y0 = rng.integers(0, 1300), rng.integers(0, 1500)
            lx, ly = rng.integers(20, 100), rng.integers(20, 100)
            xs, ys = np.meshgrid(np.arange(x0, x0 + lx), np.arange(y0, y0 + ly), indexing="ij")
            zs = 12 + ((xs - x0) * rng.uniform(-0.02, 0.02)).astype(np.int64)
        else:
            x0, y0, z0 = rng.integers(0, 1300), rng.integers(0, 1500), rng.integers(10, 20)
            length, h = rng.integers(20, 100), rng.integers(5, 20)
            a, zs = np.meshgrid(np.arange(length), np.arange(z0, z0 + h), indexing="ij")
            if rng.uniform() < 0.5:
                xs, ys = x0 + a, np.full_like(a, y0)
            else:
                xs, ys = np.full_like(a, x0), y0 + a
        keep = rng.uniform(size=xs.shape) > 0.3
        xs, ys, zs = xs[keep], ys[keep], zs[keep]
        ok = (xs < 1408) & (ys < 1600) & (zs >= 0) & (zs < 41)
        keys = _unique(np.concatenate([keys, (zs[ok] * 1600 + ys[ok]) * 1408 + xs[ok]]))
    keys = keys[:n_target]
    idx = np.stack([np.zeros_like(keys), keys // (1600 * 1408), (keys // 1408) % 1600, keys % 1408], 1)
    return idx.astype(np.int32)


def load_scan(path):
    with np.load(path) as d:
        idx = np.ascontiguousarray(d["indices"], dtype=np.int32)
        return idx, [int(s) for s in d["spatial_shape"]]


def random_scan(n: int, shape, seed: int = 0) -> np.ndarray:
    """Unique random voxels (the dry run without the real scan)."""
    rng = np.random.default_rng(seed)
    return _coords(_unique(rng.integers(0, int(np.prod(shape)), size=n * 2))[:n], shape)


def make_inputs(scan_path, dry: bool) -> dict:
    """Every case's coordinates (int32 [N, 4], batch 0) and grid shape; features come from fixed seeds."""
    if scan_path and os.path.isfile(scan_path):
        idx, shape = load_scan(scan_path)
    else:
        shape = [80, 400, 400] if dry else [80, 1600, 1600]
        idx = random_scan(3000 if dry else 125000, shape)
    if dry:  # tiny sizes, the same code
        idx = nearest(idx, 1500)
        return {"scan": (nearest(idx, 300), shape), "slab50k": (nearest(idx, 300), shape),
                "big1m": replicate_to(idx, shape, 600), "stage28k": pooled(idx, shape, 2),
                "stage212": pooled(idx, shape, 6), "scene50k": (synthetic_scene(300), SCENE_SHAPE)}
    return {"scan": (idx, shape), "slab50k": (nearest(idx, 50000), shape),
            "big1m": replicate_to(idx, shape, 1000000), "stage28k": pooled(idx, shape, 2),
            "stage212": pooled(idx, shape, 6), "scene50k": (synthetic_scene(50000), SCENE_SHAPE)}


def save_inputs(inputs: dict, path: str):
    arrays = {}
    for k, (idx, shape) in inputs.items():
        arrays[k + "/idx"] = idx
        arrays[k + "/shape"] = np.asarray(shape, np.int64)
    np.savez(path, **arrays)


def read_inputs(path: str) -> dict:
    with np.load(path) as d:
        names = {k.split("/")[0] for k in d.files}
        return {k: (d[k + "/idx"], [int(s) for s in d[k + "/shape"]]) for k in names}


# ---------------------------------------------------------------- cases (the same code for every library)
def load_network_module():
    """spconv/benchmark/network.py by path (it imports nothing from the project)."""
    spec = importlib.util.spec_from_file_location("peer_network", os.path.join(REPO, "spconv", "benchmark",
                                                                               "network.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


class Case:
    def __init__(self, torch, sp, inputs, device):
        self.torch, self.sp, self.inputs, self.device = torch, sp, inputs, device
        self.net_mod = load_network_module()

    def tensor(self, key, channels, dtype, seed=0, grad=False):
        torch = self.torch
        idx, shape = self.inputs[key]
        g = torch.Generator().manual_seed(seed)
        f = torch.randn(len(idx), channels, generator=g).to(self.device, dtype)
        if grad:
            f.requires_grad_(True)
        return self.sp.SparseConvTensor(f, torch.from_numpy(idx).to(self.device), list(shape), 1)

    def layer(self, mod, dtype, seed=0):
        self.torch.manual_seed(seed)
        return mod.to(self.device, dtype)

    def grad_like(self, t, seed=1):
        g = self.torch.Generator().manual_seed(seed)
        return self.torch.randn(*t.shape, generator=g).to(t.device, t.dtype)

    # Each returns the callable to time (everything else is set up here, untimed).
    def fresh_layer(self, key, make, channels, dtype):
        torch, sp = self.torch, self.sp
        layer = self.layer(make(), dtype)
        x = self.tensor(key, channels, dtype)

        def run():  # a fresh SparseConvTensor each call: the kernel map is built inside
            with torch.no_grad():
                return layer(sp.SparseConvTensor(x.features, x.indices, x.spatial_shape, 1))
        return run

    def cached_subm(self, key, c, dtype, backward=False):
        torch, sp = self.torch, self.sp
        layer = self.layer(sp.SubMConv3d(c, c, 3, bias=False, indice_key="k"), dtype)
        x = self.tensor(key, c, dtype)
        with torch.no_grad():
            y = layer(x)  # builds the map into y.indice_dict; y has x's coordinates
        if not backward:
            x2 = y.replace_feature(x.features)

            def run():
                with torch.no_grad():
                    return layer(x2)
            return run
        x3 = y.replace_feature(x.features.detach().clone().requires_grad_(True))
        out = layer(x3).features
        g = self.grad_like(out)
        return lambda: out.backward(g, retain_graph=True)

    def basic(self, backward):
        torch, sp = self.torch, self.sp
        net = self.layer(self.net_mod.build_basic_net(sp, 3), torch.float16)
        x = self.tensor("scan", 3, torch.float16)
        if not backward:
            def run():
                with torch.no_grad():
                    return net(sp.SparseConvTensor(x.features, x.indices, x.spatial_shape, 1))
            return run
        grads = {}

        def step():
            net.zero_grad(set_to_none=True)
            out = net(sp.SparseConvTensor(x.features, x.indices, x.spatial_shape, 1)).features
            if "g" not in grads:
                grads["g"] = self.grad_like(out)
            out.backward(grads["g"])
        return step

    def backbone_amp(self):
        torch, sp = self.torch, self.sp
        net = self.layer(self.net_mod.build_backbone8x(sp, torch.nn, 3), torch.float32).train()
        x = self.tensor("scan", 3, torch.float32)
        grads = {}
        dev_type = "cuda" if self.device.type == "cuda" else "cpu"
        amp_dtype = torch.float16 if dev_type == "cuda" else torch.bfloat16

        def step():
            net.zero_grad(set_to_none=True)
            with torch.autocast(dev_type, dtype=amp_dtype):
                out = net(sp.SparseConvTensor(x.features, x.indices, x.spatial_shape, 1)).dense()
            if "g" not in grads:
                grads["g"] = self.grad_like(out)
            out.backward(grads["g"])
        return step

    def build(self, name):
        torch, sp = self.torch, self.sp
        h, c = torch.float16, MAP_CHANNELS
        table = {
            "subm_map_50k": lambda: self.fresh_layer("slab50k", lambda: sp.SubMConv3d(c, c, 3, bias=False), c, h),
            "subm_map_1m": lambda: self.fresh_layer("big1m", lambda: sp.SubMConv3d(c, c, 3, bias=False), c, h),
            "strided_map_50k": lambda: self.fresh_layer("slab50k", lambda: sp.SparseConv3d(c, c, 3, 2, 1, bias=False),
                                                        c, h),
            "maxpool_28k": lambda: self.fresh_layer("stage28k", lambda: sp.SparseMaxPool3d(2, 2), 128, h),
            "subm_cached_212": lambda: self.cached_subm("stage212", 256, h),
            "basic_fp16_fwd": lambda: self.basic(False),
            "basic_fp16_fwdbwd": lambda: self.basic(True),
            "backbone8x_amp_train_step": self.backbone_amp,
            "subm_c256_fp16_fwd": lambda: self.cached_subm("scene50k", 256, h),
            "subm_c256_fp16_bwd": lambda: self.cached_subm("scene50k", 256, h, backward=True),
            "subm_c128_fp16_fwd": lambda: self.cached_subm("scene50k", 128, h),
            "subm_c64_fp16_fwd": lambda: self.cached_subm("scene50k", 64, h),
        }
        return table[name]()


def time_ms(torch, fn, device, warmup: int, iters: int) -> float:
    """Median of ``iters`` calls after ``warmup`` (CUDA events on a GPU, the host clock elsewhere)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
        for a, b in ev:
            a.record()
            fn()
            b.record()
        torch.cuda.synchronize()
        t = sorted(a.elapsed_time(b) for a, b in ev)
    else:
        t = []
        for _ in range(iters):
            t0 = time.perf_counter()
            fn()
            t.append((time.perf_counter() - t0) * 1e3)
        t.sort()
    return float(t[len(t) // 2])


def run_library(lib: str, inputs_path: str, device_name: str, dry: bool, peers: str, deadline: float = float("inf")):
    """{case: ms or None}, {case: why} for one library in this process; cases not started by ``deadline``
    (time.time()) are null."""
    import torch
    if lib in ("ours", "ours_sm80"):
        if lib == "ours_sm80":
            os.environ["SPCONV_FUSED_SM80"] = "1"  # read by the kernels' launchers at every launch
        sys.path.insert(0, REPO)
        import spconv.pytorch as sp
    elif lib == "spconv_triton":
        sys.path.insert(0, os.path.join(peers, "triton"))
        import spconv_triton.pytorch as sp
    else:
        import spconv.pytorch as sp  # the child's path holds spconv 2.3.8's tree only
    device = torch.device(device_name)
    inputs = read_inputs(inputs_path)
    case = Case(torch, sp, inputs, device)
    warmup, iters = (1, 1) if dry else (5, 20)
    times, why = {}, {}
    for name in CASES:
        if lib == "ours_sm80" and not sm80_case(name):
            times[name] = None
            continue
        if time.time() > deadline:
            times[name], why[name] = None, "not run: the time budget was spent"
            continue
        try:
            fn = case.build(name)
            times[name] = round(time_ms(torch, fn, device, warmup, iters), 4)
        except Exception as e:  # a case a library cannot run: null, with the reason
            times[name] = None
            why[name] = f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160] if str(e).strip() else ''}"
            traceback.print_exc(file=sys.stderr)
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return times, why


# ---------------------------------------------------------------- driver
def run_child(lib, inputs_path, device, dry, peers, timeout):
    """spconv 2.3.8 in its own interpreter: its tree on the path, the project not."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = os.path.join(peers, "site")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "out.json")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", lib, "--inputs", inputs_path, "--device", device,
               "--peers", peers, "--worker-out", out, "--budget", str(max(timeout - 10, 1))] + (
                   ["--dry-run"] if dry else [])
        r = subprocess.run(cmd, cwd=tmp, env=env, timeout=timeout, capture_output=True, text=True)
        sys.stderr.write(r.stderr[-3000:])
        if r.returncode != 0 or not os.path.isfile(out):
            raise RuntimeError(f"{lib} worker exited {r.returncode}: {r.stderr.strip().splitlines()[-1:]}")
        with open(out) as fh:
            d = json.load(fh)
        return d["times"], d["why"]


def peer_importable(lib: str, peers: str) -> str:
    """Why a peer cannot run here ('' when it can be tried)."""
    if lib == "spconv_triton":
        return "" if os.path.isdir(os.path.join(peers, "triton", "spconv_triton")) else f"{peers}/triton absent"
    return "" if os.path.isdir(os.path.join(peers, "site", "spconv")) else f"{peers}/site absent"


def commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip() or "unknown"
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"


def gpu_name(device: str) -> str:
    import torch
    if device.startswith("cuda") and torch.cuda.is_available():
        return torch.cuda.get_device_name(0)
    return "cpu"


def format_table(result: dict) -> str:
    def ms(v):
        return f"{v:10.4f}" if v is not None else f"{'null':>10}"

    def ratio(a, b):
        return f"{a / b:9.2f}x" if a is not None and b else f"{'-':>10}"

    lines = [f"device peers on {result['gpu']} at {result['commit'][:12]} (ms, median; ratio = ours / theirs, "
             "below 1 is faster)",
             f"{'case':<28} {'ours':>10} {'spconv238':>10} {'triton':>10} {'/238':>10} {'/triton':>10} "
             f"{'ours sm80':>10} {'/faster':>10}"]
    for c in result["cases"]:
        o, a, t, s8 = c["ours_ms"], c["spconv238_ms"], c["spconv_triton_ms"], c.get("ours_sm80_ms")
        peer = min((v for v in (a, t) if v is not None), default=None)
        lines.append(f"{c['name']:<28} {ms(o)} {ms(a)} {ms(t)} {ratio(o, a)} {ratio(o, t)} {ms(s8)} {ratio(s8, peer)}")
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", default="cuda", help="cuda (timed with CUDA events) or cpu")
    ap.add_argument("--dry-run", action="store_true", help="tiny sizes, ours only (peers null): the CPU check")
    ap.add_argument("--peers", default=os.path.join(REPO, ".peers"),
                    help="folder with site/ (spconv 2.3.8) and triton/ (spconv-Triton)")
    ap.add_argument("--scan", default=os.environ.get("SPCONV_REAL_SCAN") or os.path.join(
        REPO, "..", "shared", "data", "lidar-voxels-125k.npz"), help="voxelized real scan (.npz)")
    ap.add_argument("--json", default=None, help="output (default bench/results/<date>-device-<gpu>.json)")
    ap.add_argument("--child-timeout", type=float, default=150.0, help="seconds for the spconv 2.3.8 process")
    ap.add_argument("--budget", type=float, default=float("inf"),
                    help="seconds: cases not started by then are null (the JSON is always written)")
    ap.add_argument("--worker", choices=LIBS, help=argparse.SUPPRESS)
    ap.add_argument("--inputs", help=argparse.SUPPRESS)
    ap.add_argument("--worker-out", help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    peers = os.path.abspath(a.peers)
    deadline = time.time() + a.budget
    if a.worker:
        times, why = run_library(a.worker, a.inputs, a.device, a.dry_run, peers, deadline)
        with open(a.worker_out, "w") as fh:
            json.dump({"times": times, "why": why}, fh)
        return 0

    if a.device not in ("cpu", "cuda"):
        raise SystemExit(f"--device must be cpu or cuda, got {a.device!r}")
    gpu = gpu_name(a.device)
    results = {lib: {n: None for n in CASES} for lib in LIBS}
    notes = []
    with tempfile.TemporaryDirectory() as tmp:
        inputs_path = os.path.join(tmp, "inputs.npz")
        save_inputs(make_inputs(a.scan, a.dry_run), inputs_path)
        for lib in LIBS:
            if lib == "ours_sm80" and a.device != "cuda":
                notes.append(f"{lib}: not run (NVIDIA GPUs only)")
                continue
            if a.dry_run and not lib.startswith("ours"):
                notes.append(f"{lib}: not run (dry run)")
                continue
            why_not = "" if lib.startswith("ours") else peer_importable(lib, peers)
            if why_not:
                notes.append(f"{lib}: {why_not}")
                continue
            t0 = time.time()
            try:
                left = deadline - time.time()
                if left < 5:
                    notes.append(f"{lib}: not run: the time budget was spent")
                    continue
                if lib == "spconv238":
                    times, why = run_child(lib, inputs_path, a.device, a.dry_run, peers, min(a.child_timeout, left))
                else:
                    times, why = run_library(lib, inputs_path, a.device, a.dry_run, peers, deadline)
            except Exception as e:  # the library as a whole failed (import, crash, timeout): null everywhere
                traceback.print_exc(file=sys.stderr)
                notes.append(f"{lib}: {type(e).__name__}: {str(e)[:200]}")
                continue
            results[lib].update(times)
            notes += [f"{lib} {k}: {v}" for k, v in why.items()]
            print(f"{lib}: {time.time() - t0:.1f} s", file=sys.stderr)
    result = {"gpu": gpu, "commit": commit(),
              "cases": [dict(name=n, **{KEYS[lib]: results[lib][n] for lib in LIBS}) for n in CASES],
              "notes": notes}
    path = a.json
    if path is None:
        tag = "".join(ch if ch.isalnum() or ch in "._-" else "-" for ch in gpu).strip("-")
        date = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d")
        path = os.path.join(REPO, "bench", "results", f"{date}-device-{tag}.json")
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as fh:
        json.dump(result, fh, indent=1)
    for n in notes:
        print("note:", n)
    print(f"wrote {path}")
    print(format_table(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
