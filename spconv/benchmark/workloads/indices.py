"""``indices``: kernel-map building alone (SubM 3x3x3, stride-2 3x3x3, and the inverse conv's reuse of a
stored map) vs voxel count, checked against a NumPy count of the neighbour pairs."""
import functools
from typing import List

import numpy as np
import torch

import spconv.pytorch as sp
from spconv.benchmark.results import Check
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import Plan, time_fn
from spconv.benchmark.workloads.common import Context, Task, fmt_count, measurement, sparse_tensor
from spconv.benchmark.workloads.layers import voxels
from spconv.pytorch import ops

KINDS = ("subm", "conv_s2", "inverse")


def sizes(ctx: Context) -> List[int]:
    if ctx.quick:
        return [10**4]
    if ctx.full or ctx.device.type == "cuda":
        return [10**4, 10**5, 10**6]
    return [10**4, 10**5]


def tasks(ctx: Context) -> List[Task]:
    chosen = chosen_route_name(ctx.device)
    out = []
    for n in sizes(ctx):
        for route in available_routes(ctx.device, with_cpu=ctx.with_cpu_route):
            if route.name == "native" and ctx.device.type == "cuda":
                continue  # the map is built by the same GPU code whichever feature route runs after it
            out.append(Task(f"indices N={fmt_count(n)} {route.name}",
                            functools.partial(_run_one, ctx, n, route, route.name == chosen)))
    return out


def _geometry(kind: str):
    """(ksize, stride, padding, subm) of the layer whose map is built."""
    if kind == "subm":
        return [3] * 3, [1] * 3, [1] * 3, True
    return [3] * 3, [2] * 3, [1] * 3, False


def _run_one(ctx: Context, n: int, route: Route, chosen: bool):
    f, idx, shape = voxels(n, ctx.seed, ctx.quick)
    device = route.device
    plan = ctx.plan if device.type == ctx.device.type else Plan(1, 2)
    plan = Plan(plan.warmup, max(plan.iters, 5))  # map building is cheap enough for a few more iterations
    indices = torch.from_numpy(idx).to(device)
    for kind in ("subm", "conv_s2"):
        k, s, p, subm = _geometry(kind)
        out_shape = shape if subm else ops.get_conv_output_size(shape, k, s, p, [1] * 3)
        build = lambda: ops.build_kernel_map(indices, 1, shape, out_shape, k, s, p, [1] * 3, subm, False)  # noqa
        with forced_native(route.force_native):
            stats = time_fn(build, device, plan)
            out_idx, maps = build()
        case = f"{kind} N={fmt_count(len(idx))}"
        measurement(ctx, "indices", case, route, chosen, "int32", "build", len(idx), [], stats, with_mm=False)
        counts = maps.pair_counts().cpu().numpy()
        ref_counts, ref_out = reference_pairs(idx, shape, k, s, p, subm)
        err = float(np.abs(counts - ref_counts).sum() + abs(out_idx.shape[0] - ref_out))
        ctx.record.checks.append(Check("indices", f"{case} {route.name} pairs per offset vs NumPy count", err, 0.0,
                                       f"{int(ref_counts.sum())} pairs, {ref_out} outputs"))
        if kind == "conv_s2":
            # Inverse conv: the stored stride-2 map reversed, plus a 1-channel feature pass (the map itself is
            # reused, which is the point of SparseInverseConv3d).
            torch.manual_seed(ctx.seed)
            down = sp.SparseConv3d(1, 1, 3, 2, 1, bias=False, indice_key="d").to(device)
            inv = sp.SparseInverseConv3d(1, 1, 3, indice_key="d", bias=False).to(device)
            x = sparse_tensor(sp, np.ones((len(idx), 1), np.float32), idx, shape, device, torch.float32)
            with torch.no_grad(), forced_native(route.force_native):
                y = down(x)
                stats = time_fn(lambda: inv(y), device, plan)
            measurement(ctx, "indices", f"inverse N={fmt_count(len(idx))} (reuse + 1-ch conv)", route, chosen,
                        "int32", "build", len(idx), [], stats, with_mm=False)


def reference_pairs(indices: np.ndarray, shape, ksize, stride, padding, subm: bool):
    """Pairs per kernel offset and the output count, from sorted 64-bit keys and np.searchsorted."""
    zyx = indices[:, 1:].astype(np.int64)
    b = indices[:, 0].astype(np.int64)
    k, s, p = (np.asarray(v, np.int64) for v in (ksize, stride, padding))
    out_shape = np.asarray(shape, np.int64) if subm else (np.asarray(shape) + 2 * p - k) // s + 1

    def key(bb, c):
        return ((bb * out_shape[0] + c[:, 0]) * out_shape[1] + c[:, 1]) * out_shape[2] + c[:, 2]

    offsets = np.stack(np.meshgrid(*[np.arange(v) for v in k], indexing="ij"), -1).reshape(-1, 3)
    counts = np.zeros(len(offsets), np.int64)
    if subm:
        keys = np.sort(key(b, zyx))
        for o, off in enumerate(offsets):
            nb = zyx + off - k // 2
            ok = np.all((nb >= 0) & (nb < out_shape), 1)
            q = key(b[ok], nb[ok])
            pos = np.searchsorted(keys, q).clip(max=len(keys) - 1)
            counts[o] = int((keys[pos] == q).sum()) if len(keys) else 0
        return counts, len(zyx)
    outs = []
    for o, off in enumerate(offsets):
        num = zyx + p - off  # out * s = in + p - off
        ok = np.all(num % s == 0, 1)
        oc = num // s
        ok &= np.all((oc >= 0) & (oc < out_shape), 1)
        counts[o] = int(ok.sum())
        outs.append(key(b[ok], oc[ok]))
    return counts, int(np.unique(np.concatenate(outs)).size) if outs else 0
