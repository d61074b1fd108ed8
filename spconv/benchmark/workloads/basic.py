"""``basic`` and ``large``: spconv's bench_basic network end to end (kernel maps built inside, as in a model),
on a scan (synthetic by default, ``--data``) or on stacked sweeps (``large``, ``--points``)."""
import functools
import os
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

import spconv.pytorch as sp
from spconv.benchmark import fused_work, network, reference, scenes
from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.results import Check
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import Clock, Plan, time_fn, time_train_step
from spconv.benchmark.workloads.common import (DTYPES, Context, Task, fixed_grad, fmt_count, measurement,
                                               sparse_tensor, tf32_mode)

# Dense-reference window (z, y, x): the first two stages of the network (SubM, SubM, pool, SubM, SubM) on it.
CROP = (16, 64, 64)
QUICK_CROP = (8, 32, 32)
CHECK_PREFIX = 5


@dataclass
class Scan:
    label: str
    features: np.ndarray
    indices: np.ndarray
    shape: List[int]

    @property
    def voxels(self) -> int:
        return int(self.indices.shape[0])


@functools.lru_cache(maxsize=4)
def basic_scan(data: Optional[str], quick: bool, seed: int) -> Scan:
    if data:
        f, i, s = scenes.load_voxels_npz(data)
        return Scan(f"{os.path.basename(data)} ({fmt_count(len(i))} voxels)", f, i, s)
    f, i, s = scenes.synthetic_scan(quick, seed)
    return Scan(f"synthetic scan ({fmt_count(len(i))} voxels{', quick' if quick else ''})", f, i, s)


@functools.lru_cache(maxsize=4)
def large_scan(points: Optional[str], quick: bool, seed: int) -> Scan:
    """bench_large: the sweep x8, copy k shifted by k m along y, voxelized at 0.1 m by the project's PointToVoxel."""
    pc = scenes.load_points_npz(points) if points else scenes.synthetic_points(quick, seed)
    pc = scenes.replicate_sweep(pc, copies=8, shift_m=1.0)
    grid = scenes.QUICK_GRID if quick else scenes.DEFAULT_GRID
    from spconv.pytorch.utils import PointToVoxel
    gen = PointToVoxel(vsize_xyz=list(grid.vsize), coors_range_xyz=list(grid.coors_range), num_point_features=3,
                       max_num_voxels=len(pc), max_num_points_per_voxel=5)
    voxels, coords, num = gen(torch.from_numpy(pc))
    feats = (voxels.sum(1) / num.clamp(min=1).unsqueeze(1).to(voxels.dtype)).numpy()
    idx = np.concatenate([np.zeros((len(coords), 1), np.int32), coords.numpy().astype(np.int32)], 1)
    src = os.path.basename(points) if points else "synthetic sweep"
    return Scan(f"{src} x8 ({fmt_count(len(idx))} voxels)", feats, idx, list(grid.spatial_shape))


def build_net(device, dtype, seed: int = 0):
    """Same weights for every route and dtype (drawn in FP32, then cast)."""
    torch.manual_seed(seed)
    return network.build_basic_net(sp).to(device, dtype)


def trace_layers(net, x) -> List[ConvLayer]:
    """Runs the network once and reads each SubM layer's pair count from its stored kernel map."""
    specs = network.basic_layer_specs(x.features.shape[1])
    seen: List[Dict] = []
    hooks = [m.register_forward_hook(lambda mod, inp, out: seen.append({"n_in": inp[0].indices.shape[0],
                                                                        "n_out": out.indices.shape[0],
                                                                        "out": out}))
             for m in net.children()]
    try:
        with torch.no_grad():
            net(x)
    finally:
        for h in hooks:
            h.remove()
    layers = []
    for i, ((kind, cin, cout, key), rec) in enumerate(zip(specs, seen)):
        if kind != "subm":
            continue
        data = rec["out"].indice_dict[key]
        pairs = int(data.indice_pair_num.sum().item())
        layers.append(ConvLayer(f"{i}:subm{cin}->{cout}", cin, cout, pairs, rec["n_in"], rec["n_out"],
                                input_grad=i > 0, **fused_work.layer_work(data.maps, cin, cout)))
    return layers


class LayerClock:
    """Per-layer forward times through module hooks (device events on GPU)."""

    def __init__(self, net, device):
        self.clock = Clock(device)
        self.names = [f"{i}:{type(m).__name__}" for i, m in enumerate(net.children())]
        self.samples: List[List[float]] = [[] for _ in self.names]
        self._marks = []
        self._hooks = []
        for i, m in enumerate(net.children()):
            self._hooks.append(m.register_forward_pre_hook(functools.partial(self._pre, i)))
            self._hooks.append(m.register_forward_hook(functools.partial(self._post, i)))

    def _pre(self, i, mod, inp):
        self._marks.append((i, self.clock.mark()))

    def _post(self, i, mod, inp, out):
        self._marks.append((i, self.clock.mark()))

    def collect(self):
        for (i, t0), (_, t1) in zip(self._marks[::2], self._marks[1::2]):
            self.samples[i].append(self.clock.elapsed_ms(t0, t1))
        self._marks = []

    def remove(self):
        for h in self._hooks:
            h.remove()


def _dense_check(ctx: Context, workload: str, scan: Scan, route: Route, dtype_name: str, backward: bool,
                 size=None) -> Check:
    """The network's first stages on a cropped window vs F.conv3d / F.max_pool3d on its dense grid.

    The reference runs in FP32 (FP64 for an FP64 check) with the very weights the sparse net has. Weight gradients
    are compared in FP32 only for the layers after the max-pool: a pool's winner can flip between near-equal
    inputs under FP32 rounding and send a gradient elsewhere, which is not a wrong answer. The FP64 check
    compares every layer's dW.
    """
    size = size or (QUICK_CROP if ctx.quick else CROP)
    origin = scenes.crop_window(scan.indices, size, seed=ctx.seed)
    f, i, shape = scenes.crop(scan.features, scan.indices, origin, size)
    dtype = DTYPES[dtype_name]
    ref_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    net = build_net(route.device, dtype, ctx.seed)[:CHECK_PREFIX]
    ref_net = build_net(torch.device("cpu"), ref_dtype, ctx.seed)[:CHECK_PREFIX]
    specs = network.basic_layer_specs(scan.features.shape[1])[:CHECK_PREFIX]
    convs = [m for m in net.children() if hasattr(m, "weight")]
    weights = [m.weight for m in ref_net.children() if hasattr(m, "weight")]
    with torch.no_grad():
        for w, m in zip(weights, convs):
            w.copy_(m.weight.to(ref_dtype).cpu())
    backward = backward and dtype in (torch.float32, torch.float64) and dtype_name != "tf32"
    x = sparse_tensor(sp, f, i, shape, route.device, dtype)
    with forced_native(route.force_native), tf32_mode(dtype_name):
        y = net(x)
        got = y.dense().to(ref_dtype).cpu()
        if backward:
            y.features.backward(fixed_grad()(y.features))
    xd, mask = reference.to_dense(torch.from_numpy(f).to(dtype).to(ref_dtype), torch.from_numpy(i), shape)
    ref = reference.dense_sequential(specs, weights, xd, mask)
    err = reference.rel_error(got, ref)
    what = f"{route.name} {dtype_name} vs dense F.conv3d reference, crop {'x'.join(map(str, size))}"
    detail = f"{len(i)} voxels, first {CHECK_PREFIX} modules"
    if backward:
        # dW of the sparse net vs dW of the dense net for the same upstream gradient at the active sites.
        oi = y.indices.cpu().long()
        ref[0].permute(1, 2, 3, 0)[oi[:, 1], oi[:, 2], oi[:, 3]].backward(
            fixed_grad()(y.features).to(ref_dtype).cpu())
        last_pool = max(j for j, s in enumerate(specs) if s[0] == "pool")
        conv_pos = [j for j, s in enumerate(specs) if s[0] == "subm"]
        pairs = [(m.weight.grad, r.grad) for j, m, r in zip(conv_pos, convs, weights)
                 if dtype == torch.float64 or j > last_pool]
        err = max(err, max(reference.rel_error(g, r) for g, r in pairs))
        what += " (output and dW, every layer)" if dtype == torch.float64 else " (output and dW after the pool)"
    tol = reference.TF32_TOLERANCE if dtype_name == "tf32" else reference.TOLERANCE[dtype]
    return Check(workload, what, err, tol, detail)


def tasks(ctx: Context, which: str = "basic") -> List[Task]:
    scan_fn = (lambda: basic_scan(ctx.data, ctx.quick, ctx.seed)) if which == "basic" else \
        (lambda: large_scan(ctx.points, ctx.quick, ctx.seed))
    chosen = chosen_route_name(ctx.device)
    routes = available_routes(ctx.device, with_cpu=ctx.with_cpu_route)
    state: Dict[str, object] = {}
    out: List[Task] = []
    for route in routes:
        for dtype_name in ctx.dtypes:
            if route.device.type == "cpu" and dtype_name == "tf32":
                continue
            label = f"{which} {route.name} {dtype_name}"
            out.append(Task(label, functools.partial(_run_one, ctx, which, scan_fn, route, route.name == chosen,
                                                     dtype_name, state)))
    return out


def _run_one(ctx: Context, which: str, scan_fn, route: Route, chosen: bool, dtype_name: str, state: Dict):
    scan = scan_fn()
    ctx.record.meta.setdefault("inputs", {})[which] = {"label": scan.label, "voxels": scan.voxels,
                                                        "spatial_shape": scan.shape}
    dtype = DTYPES[dtype_name]
    device = route.device
    plan = ctx.plan if device.type == ctx.device.type else Plan(1, 2)
    net = build_net(device, dtype, ctx.seed)
    x = sparse_tensor(sp, scan.features, scan.indices, scan.shape, device, dtype)
    case = scan.label
    with forced_native(route.force_native), tf32_mode(dtype_name):
        layers = trace_layers(net, x)
        # Inference forward, kernel maps built inside (a fresh tensor has an empty indice_dict).
        lc = LayerClock(net, device)
        with torch.no_grad():
            fwd = time_fn(lambda: net(x), device, Plan(max(plan.warmup - 1, 0), plan.iters), on_iter=lc.collect)
        lc.remove()
        measurement(ctx, which, case, route, chosen, dtype_name, "forward", scan.voxels, layers, fwd)
        if chosen or "layers" not in state:
            state["layers"] = True
            ctx.record.layers[f"{which} {route.name} {dtype_name}"] = _layer_rows(lc, layers)
        # Training step: forward with autograd, then backward (dW everywhere, dX after the first layer).
        try:
            # The tracing forward above already warmed the kernels and maps up: it counts as one warm-up.
            train = time_train_step(lambda: net(x).features, fixed_grad(), device,
                                    Plan(max(plan.warmup - 1, 0), plan.iters),
                                    zero_grad=lambda: net.zero_grad(set_to_none=True))
        except Exception as e:  # report and go on: a broken backward must not hide the forward figures
            ctx.record.checks.append(Check(which, f"{route.name} {dtype_name} backward runs", float("inf"), 0.0,
                                           f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
            train = None
        if train is not None:
            for pass_name in ("backward", "forward_backward"):
                measurement(ctx, which, case, route, chosen, dtype_name, pass_name, scan.voxels, layers,
                            train[pass_name])
        if device.type != "cpu" and route.name != "native" and not route.force_native:
            ctx.record.checks.append(_vs_native(which, net, x, route, dtype_name))
    ctx.record.checks.append(_dense_check(ctx, which, scan, route, dtype_name, backward=train is not None))
    if train is not None and dtype_name == ctx.dtypes[0]:
        # Every layer's dW, pool backward included, where rounding can't flip a max: FP64 on a small window.
        ctx.record.checks.append(_dense_check(ctx, which, scan, route, "fp64", backward=True, size=QUICK_CROP))


def _vs_native(which: str, net, x, route: Route, dtype_name: str) -> Check:
    """The whole network on this route vs the same network on the native route (same device, dtype)."""
    with torch.no_grad():
        got = net(x).dense().float().cpu()
        with forced_native(True):
            ref = net(x).dense().float().cpu()
    tol = reference.TF32_TOLERANCE if dtype_name == "tf32" else reference.TOLERANCE[DTYPES[dtype_name]]
    return Check(which, f"{route.name} {dtype_name} vs native route, whole network", reference.rel_error(got, ref),
                 tol, f"{x.indices.shape[0]} voxels")


def _layer_rows(lc: LayerClock, layers: List[ConvLayer]) -> List[Dict[str, object]]:
    by_index = {int(layer.name.split(":")[0]): layer for layer in layers}
    rows = []
    for i, (name, samples) in enumerate(zip(lc.names, lc.samples)):
        ms = float(np.median(samples)) if samples else float("nan")
        layer = by_index.get(i)
        row = {"layer": name, "ms": ms}
        if layer is not None:
            row.update(layer.to_dict())
            row["gflop"] = 2 * layer.pairs * layer.cin * layer.cout / 1e9
            row["gflops"] = row["gflop"] / (ms / 1e3) if ms > 0 else None
        rows.append(row)
    return rows
