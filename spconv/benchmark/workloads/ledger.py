"""``ledger``: what the GPU code costs besides its kernel bodies, counted on any machine.

The benchmark's basic network runs on a slab of a scan through the GPU code built for the HIP CPU runtime
(docs/hip_cpu.md), on the fused route and on the native GPU route (SPCONV_FORCE_NATIVE), and every module's
forward and backward is counted (spconv/benchmark/launch_ledger.py): kernel launches (the project's, exact;
ATen's), host waits, allocations, host time outside kernel bodies. The kernel-map builder inside a layer is
counted apart (its ``map`` row). Extra rows: a strided conv building its map and on the cached map, a max pool
on a cached map; then the whole network's forward and backward.

TARGETS are the budgets the GPU code is meant to reach (printed beside today's counts, not enforced here;
test/test_hip_cpu_ledger.py holds today's counts as upper bounds).
"""
import contextlib
import functools
import os
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import torch

import spconv.pytorch as sp
from spconv import constants
from spconv.benchmark import network, scenes
from spconv.benchmark.launch_ledger import Ledger, Tally, load_hip_cpu
from spconv.benchmark.workloads.common import Context, Task, fixed_grad

ROUTES = ("fused", "native")
VOXELS = 20000
QUICK_VOXELS = 2000

# Goal budgets (total launches, host waits) by (route, row kind, pass); None: no budget stated. "map" kinds are
# the kernel-map builder alone, "*_build" the layer around it. On the native route a feature op spends a vendor
# GEMM per kernel offset (two in backward: dinput and dfilter) and, per layer, the rows' gathers, one sum and the
# bias (kvol + 3 forward, 2 kvol + 4 backward, filled in per row): without a grouped GEMM in both vendors'
# libraries, the per-offset GEMMs are the floor.
TARGETS: Dict[Tuple[str, str, str], Tuple[Optional[int], Optional[int]]] = {
    ("fused", "subm_map", "forward"): (6, 0),
    ("fused", "strided_map", "forward"): (8, 1),
    ("fused", "pool_map", "forward"): (8, 1),
    ("fused", "pool_build", "forward"): (8, 1),  # a pool that builds its map: the map and its one kernel
    ("fused", "subm_cached", "forward"): (3, 0),
    ("fused", "subm_cached", "backward"): (4, 0),
    ("fused", "subm_build", "backward"): (4, 0),
    ("fused", "strided_cached", "forward"): (3, 0),
    ("fused", "strided_cached", "backward"): (4, 0),
    ("fused", "strided_build", "backward"): (4, 0),
    ("fused", "pool_cached", "forward"): (1, 0),
    ("fused", "pool_cached", "backward"): (1, 0),
    ("fused", "pool_build", "backward"): (1, 0),
    ("fused", "network", "forward"): (130, None),  # waits: one per strided map or pool (filled in per network)
    ("native", "subm_map", "forward"): (6, 0),
    ("native", "strided_map", "forward"): (8, 1),
    ("native", "pool_map", "forward"): (8, 1),
    ("native", "pool_build", "forward"): (8, 1),
}
FEATURE_KINDS = ("subm_cached", "subm_build", "strided_cached", "strided_build", "pool_cached", "pool_build")


def target(route: str, kind: str, pass_name: str, kvol: int = 0, strided_maps: int = 0):
    """(launches, waits) goal of one row, or (None, None)."""
    if route == "native" and kind in FEATURE_KINDS and not (kind.endswith("_build") and pass_name == "forward"):
        # (a layer building its map: the map row has the map's budget)
        return (kvol + 3 if pass_name == "forward" else 2 * kvol + 4), 0
    launches, waits = TARGETS.get((route, kind, pass_name), (None, None))
    if kind == "network" and pass_name == "forward" and route == "fused":
        waits = strided_maps
    return launches, waits


@dataclass
class Row:
    route: str
    module: str
    kind: str
    pass_name: str
    tally: Tally
    kvol: int = 0

    def to_dict(self, strided_maps: int) -> Dict[str, object]:
        t_launch, t_wait = target(self.route, self.kind, self.pass_name, self.kvol, strided_maps)
        d = {"route": self.route, "module": self.module, "kind": self.kind, "pass": self.pass_name}
        d.update(self.tally.to_dict())
        d.update(target_launches=t_launch, target_waits=t_wait)
        return d


def slab(n: int, path: Optional[str] = None, seed: int = 0):
    """The ``n`` voxels of a scan nearest its grid centre (a real scan's sensor; a contiguous piece keeps the
    neighbourhood structure), batch 0: (features, indices, spatial_shape, label)."""
    if path:
        f, i, shape = scenes.load_voxels_npz(path)
        src = path.rsplit("/", 1)[-1]
    else:
        f, i, shape = scenes.synthetic_scan(False, seed)
        src = "synthetic scan"
    rows = scenes.nearest_voxels(i, n)
    idx = i[rows].copy()
    idx[:, 0] = 0
    return f[rows], idx, shape, f"{src}, {len(rows)} voxels nearest the grid centre"


@contextlib.contextmanager
def counted_map_builds(ledger: Ledger):
    """Counts every kernel-map build of the layers in the scope ``map``."""
    from spconv.pytorch import ops as sp_ops
    build = sp_ops.build_kernel_map

    def wrapped(*args, **kwargs):
        with ledger.scope("map"):
            return build(*args, **kwargs)

    sp_ops.build_kernel_map = wrapped
    try:
        yield
    finally:
        sp_ops.build_kernel_map = build


@contextlib.contextmanager
def route(name: str):
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = name == "native"
    try:
        yield
    finally:
        constants.SPCONV_FORCE_NATIVE = old


def _fresh(x, grad: bool):
    return x.replace_feature(x.features.detach().requires_grad_(grad))


class Extras(torch.nn.Module):
    """The rows the basic network lacks: a strided conv (3, stride 2) and a keyed max pool on stage 1's output."""

    def __init__(self, c: int):
        super().__init__()
        torch.manual_seed(1)
        self.down = sp.SparseConv3d(c, c, 3, 2, 1, bias=False, indice_key="down")
        self.pool = sp.SparseMaxPool3d(2, 2, indice_key="pool")


def one_pass(net, extras: Extras, make_input: Callable, step: Callable) -> Dict[tuple, object]:
    """Every counted call in a fixed order from a fresh input (maps and cached tables built anew), so that a
    counting pass and a timing pass see the same states. ``step(fn) -> (stats, result)``; returns
    {(module index or name, pass): stats}."""
    from spconv.pytorch import ops as sp_ops
    from spconv.pytorch.functional import conv_features, weight_to_filters
    out: Dict[tuple, object] = {}
    grad = fixed_grad()
    # Module by module, each on a detached copy of its input; backward in reverse order, as autograd runs it.
    cur, saved = make_input(), []
    for i, m in enumerate(net.children()):
        inp = _fresh(cur, i > 0)
        out[(i, "forward")], cur = step(functools.partial(m, inp))
        saved.append((inp, cur))
    g = grad(cur.features)
    for i in reversed(range(len(saved))):
        inp, y = saved[i]
        out[(i, "backward")], _ = step(functools.partial(y.features.backward, g))
        g = inp.features.grad
    stage1 = saved[1][1]
    # Strided conv building its map, then its features on the cached map (the dispatcher's entry point: a
    # strided conv cannot reuse a key through the module API).
    inp = _fresh(stage1, True)
    out[("strided", "forward")], y = step(functools.partial(extras.down, inp))
    out[("strided", "backward")], _ = step(functools.partial(y.features.backward, grad(y.features)))
    datas = y.indice_dict["down"]
    inp = _fresh(stage1, True)
    out[("strided_cached", "forward")], f = step(lambda: conv_features(inp.features, weight_to_filters(
        extras.down.weight), datas.maps, datas.out_indices.shape[0]))
    out[("strided_cached", "backward")], _ = step(functools.partial(f.backward, grad(f)))
    # Max pool on a cached map (the keyed pool's map, uncounted).
    with torch.no_grad():
        pooled = extras.pool(_fresh(stage1, False))
    datas = pooled.indice_dict["pool"]
    inp = _fresh(stage1, True)
    out[("pool_cached", "forward")], f = step(lambda: sp_ops.indice_maxpool_native(inp.features, datas.maps,
                                                                                  datas.out_indices.shape[0]))
    out[("pool_cached", "backward")], _ = step(functools.partial(f.backward, grad(f)))
    # The whole network.
    x = _fresh(make_input(), False)
    out[("network", "forward")], y = step(functools.partial(net, x))
    out[("network", "backward")], _ = step(functools.partial(y.features.backward, grad(y.features)))
    return out


def run_ledger(lib, features: np.ndarray, indices: np.ndarray, shape: List[int], routes=ROUTES,
               timed: bool = True) -> List[Row]:
    """The ledger's rows for the basic network on these voxels, through the HIP CPU op library ``lib``."""
    from spconv import _backend
    ledger = Ledger(lib)
    torch.manual_seed(0)
    net = network.build_basic_net(sp, features.shape[1]).float()
    extras = Extras(network.BASIC_CHANNELS[1])
    specs = network.basic_layer_specs(features.shape[1])

    def make_input():
        return sp.SparseConvTensor(torch.from_numpy(np.ascontiguousarray(features)),
                                   torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int32)), list(shape), 1)

    def counting(fn):
        total, scopes, result = ledger.count(fn)
        return (total, scopes), result

    def timing(fn):
        times, scopes, result = ledger.time(fn)
        return (times, scopes), result

    rows: List[Row] = []
    for r in routes:
        with route(r), _backend.gpu_code_on_cpu(ledger.namespace), counted_map_builds(ledger):
            counts = one_pass(net, extras, make_input, counting)
            times = one_pass(net, extras, make_input, timing) if timed else {}
        for key, (total, scopes) in counts.items():
            if key in times:
                (total.wall_ms, total.kernel_ms), tscopes = times[key]
                for name, (wall, kern) in tscopes.items():
                    if name in scopes:
                        scopes[name].wall_ms, scopes[name].kernel_ms = wall, kern
            who, pass_name = key
            name, kind, kvol = _describe(who, specs, seen_keys=_keys_before(who, specs))
            if "map" in scopes:
                rows.append(Row(r, name + " map", kind.split("_")[0] + "_map", pass_name, scopes["map"]))
            rows.append(Row(r, name, kind, pass_name, total, kvol))
    return rows


def _keys_before(who, specs) -> set:
    return {s[3] for s in specs[:who]} if isinstance(who, int) else set()


def _describe(who, specs, seen_keys) -> Tuple[str, str, int]:
    """(row name, kind, kernel volume) of a counted call."""
    if isinstance(who, int):
        kind, cin, cout, key = specs[who]
        if kind == "subm":
            cached = key in seen_keys
            return (f"{who}:SubMConv3d {cin}->{cout} ({key}{', cached' if cached else ''})",
                    "subm_cached" if cached else "subm_build", 27)
        return f"{who}:SparseMaxPool3d(2, 2) C={cin}", "pool_build", 8
    c = network.BASIC_CHANNELS[1]
    return {"strided": (f"SparseConv3d {c}->{c} (3, stride 2)", "strided_build", 27),
            "strided_cached": (f"SparseConv3d {c}->{c} (3, stride 2, cached map)", "strided_cached", 27),
            "pool_cached": (f"SparseMaxPool3d(2, 2) C={c} (cached map)", "pool_cached", 8),
            "network": (f"basic network ({len(specs)} modules)", "network", 0)}[who]


def strided_maps_of(specs) -> int:
    return sum(1 for s in specs if s[0] == "pool")


def format_table(rows: List[Row], strided_maps: int) -> str:
    """One table per route: count, goal, and time columns."""
    out = []
    head = (f"{'module':<48} {'pass':<8} {'ours':>5} {'aten':>5} {'total':>6} {'target':>6} {'waits':>5} "
            f"{'target':>6} {'allocs':>6} {'host ms':>8} {'kern ms':>8}")
    for r in sorted({row.route for row in rows}, key=ROUTES.index):
        out.append(f"== launch ledger, {r} route" + (" (SPCONV_FORCE_NATIVE=1)" if r == "native" else ""))
        out.append(head)
        for row in (x for x in rows if x.route == r):
            d = row.to_dict(strided_maps)
            fmt = lambda v: "-" if v is None else str(v)  # noqa: E731
            out.append(f"{row.module[:48]:<48} {row.pass_name:<8} {d['launches']:>5} {d['aten_launches']:>5} "
                       f"{d['total_launches']:>6} {fmt(d['target_launches']):>6} {d['host_waits']:>5} "
                       f"{fmt(d['target_waits']):>6} {fmt(d['allocations']):>6} {d['host_ms']:>8.2f} "
                       f"{d['kernel_ms']:>8.2f}")
        out.append("")
    out.append("ours: the project's kernels (launch_kernel, exact); aten: ATen ops that launch device work "
               "(innermost non-view ops); waits: device->host copies of the glue + ATen ops that wait for the "
               "device; target: the budget the GPU code is meant to reach; host ms: wall time outside "
               "launch_kernel and the counted ATen ops (a second run without the profiler; 0: not timed); "
               "kern ms: inside launch_kernel on the HIP CPU runtime.")
    return "\n".join(out)


def default_scan() -> Optional[str]:
    """The real scan beside a source checkout (SPCONV_REAL_SCAN overrides), or None (then a synthetic scan)."""
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    path = os.environ.get("SPCONV_REAL_SCAN") or os.path.join(repo, "..", "shared", "data", "lidar-voxels-125k.npz")
    return path if os.path.isfile(path) else None


def tasks(ctx: Context) -> List[Task]:
    return [Task("ledger basic (HIP CPU build)", functools.partial(_run, ctx))]


def _run(ctx: Context):
    n = QUICK_VOXELS if ctx.quick else VOXELS
    f, i, shape, label = slab(n, ctx.data or default_scan(), ctx.seed)
    lib = load_hip_cpu()
    rows = run_ledger(lib, f, i, shape, timed=ctx.plan.iters > 0)  # --iters 0: counts only
    sm = strided_maps_of(network.basic_layer_specs(f.shape[1]))
    ctx.record.ledger = {"input": label, "voxels": int(len(i)), "spatial_shape": list(shape),
                         "library": lib.name, "rows": [r.to_dict(sm) for r in rows]}
    ctx.record.ledger_table = format_table(rows, sm)
