"""``layers``: one SubMConv3d or strided SparseConv3d (3x3x3) at a time, swept over channels and voxel counts,
with the kernel map cached (features only, as for the 2nd..nth layer sharing an indice_key) and uncached
(map built in the call, as for the first)."""
import functools
from typing import List, Tuple

import torch

import spconv.pytorch as sp
from spconv.benchmark import reference, scenes
from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.results import Check
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import Plan, time_fn, time_train_step
from spconv.benchmark.workloads.common import (DTYPES, Context, Task, fixed_grad, fmt_count, measurement,
                                               sparse_tensor, tf32_mode)

KINDS = ("subm", "conv_s2")
CHANNELS = (16, 64, 128, 256)
CROP = (8, 24, 24)


def sweep(ctx: Context) -> List[Tuple[str, int, int]]:
    """(kind, C, N) triples. 1e6 voxels only on a GPU or with --full."""
    if ctx.quick:
        grid = [(16, 10**4), (64, 10**4)]
    elif ctx.full:
        grid = [(c, n) for n in (10**4, 10**5, 10**6) for c in CHANNELS]
    elif ctx.device.type == "cuda":
        grid = [(c, n) for n in (10**4, 10**5, 10**6) for c in CHANNELS]
    else:
        # A 2-core CPU keeps to the 2-minute budget: every C at 1e4, and SubM 64->64 at 1e5 (the CPU target).
        return [(k, c, 10**4) for k in KINDS for c in CHANNELS] + [("subm", 64, 10**5)]
    return [(k, c, n) for k in KINDS for c, n in grid]


@functools.lru_cache(maxsize=4)
def voxels(n: int, seed: int, quick: bool = False):
    return scenes.lidar_voxels(n, quick=quick, seed=seed)


def make_layer(kind: str, c: int, device, dtype, seed: int):
    torch.manual_seed(seed)
    if kind == "subm":
        m = sp.SubMConv3d(c, c, 3, bias=False, indice_key="k")
    else:
        m = sp.SparseConv3d(c, c, 3, stride=2, padding=1, bias=False, indice_key="k")
    return m.to(device, dtype)


def features_only(layer, x, datas):
    """The feature pass of ``layer`` on a stored kernel map. Strided convs can't reuse a key through the module
    API, so both kinds go through the dispatcher's entry point directly."""
    from spconv.pytorch.functional import conv_features, weight_to_filters
    return conv_features(x.features, weight_to_filters(layer.weight), datas.maps, datas.out_indices.shape[0])


def tasks(ctx: Context) -> List[Task]:
    chosen = chosen_route_name(ctx.device)
    out = []
    for kind, c, n in sweep(ctx):
        for route in available_routes(ctx.device, with_cpu=ctx.with_cpu_route and n < 10**6):
            for dtype_name in ctx.dtypes:
                if route.device.type == "cpu" and dtype_name == "tf32":
                    continue
                out.append(Task(f"layers {kind} C={c} N={fmt_count(n)} {route.name} {dtype_name}",
                                functools.partial(_run_one, ctx, kind, c, n, route, route.name == chosen, dtype_name)))
    from spconv.benchmark.workloads import grouped  # groups > 1 rows, on the basic scan
    from spconv.benchmark.workloads import int8  # int8 next to fp32
    return out + grouped.tasks(ctx) + int8.tasks(ctx)


def _run_one(ctx: Context, kind: str, c: int, n: int, route: Route, chosen: bool, dtype_name: str):
    f, idx, shape = voxels(n, ctx.seed, ctx.quick)
    device, dtype = route.device, DTYPES[dtype_name]
    plan = ctx.plan if device.type == ctx.device.type else Plan(1, 2)
    gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
    feats = torch.randn(len(idx), c, generator=gen).numpy()
    layer = make_layer(kind, c, device, dtype, ctx.seed)
    x = sparse_tensor(sp, feats, idx, shape, device, dtype)
    name = f"{kind} {c}->{c}"
    with forced_native(route.force_native), tf32_mode(dtype_name):
        with torch.no_grad():
            y = layer(x)
        datas = y.indice_dict["k"]
        pairs = int(datas.indice_pair_num.sum().item())
        info = [ConvLayer(name, c, c, pairs, len(idx), y.indices.shape[0], input_grad=True)]
        case = f"{name} N={fmt_count(len(idx))}"
        with torch.no_grad():
            unc = time_fn(lambda: layer(x), device, plan)
            cached = time_fn(lambda: features_only(layer, x, datas), device, plan)
        measurement(ctx, "layers", case + " uncached", route, chosen, dtype_name, "forward", len(idx), info, unc)
        measurement(ctx, "layers", case + " cached", route, chosen, dtype_name, "forward", len(idx), info, cached)
        xg = sparse_tensor(sp, feats, idx, shape, device, dtype, requires_grad=True)

        def zero():
            layer.zero_grad(set_to_none=True)
            xg.features.grad = None

        try:
            train = time_train_step(lambda: features_only(layer, xg, datas), fixed_grad(), device, plan, zero)
            for pass_name in ("backward", "forward_backward"):
                measurement(ctx, "layers", case + " cached", route, chosen, dtype_name, pass_name, len(idx), info,
                            train[pass_name])
            backward_ok = True
        except Exception as e:
            ctx.record.checks.append(Check("layers", f"{case} {route.name} {dtype_name} backward runs",
                                           float("inf"), 0.0, f"{type(e).__name__}: {str(e).splitlines()[0][:160]}"))
            backward_ok = False
        ctx.record.checks.append(_dense_check(ctx, kind, c, f, idx, feats, route, dtype_name, backward_ok, case))


def _dense_check(ctx, kind, c, f, idx, feats, route: Route, dtype_name, backward: bool, case: str) -> Check:
    """The layer on a cropped window vs F.conv3d on its dense grid: output, and dX/dW when backward runs."""
    origin = scenes.crop_window(idx, CROP, seed=ctx.seed)
    cf, ci, shape = scenes.crop(feats, idx, origin, CROP)
    dtype = DTYPES[dtype_name]
    layer = make_layer(kind, c, route.device, dtype, ctx.seed)
    ref_layer = make_layer(kind, c, torch.device("cpu"), torch.float32, ctx.seed)
    with torch.no_grad():  # the very weights the sparse layer has (rounded to its dtype)
        ref_layer.weight.copy_(layer.weight.float().cpu())
    with forced_native(route.force_native), tf32_mode(dtype_name):
        x = sparse_tensor(sp, cf, ci, shape, route.device, dtype, requires_grad=backward)
        y = layer(x)
        got = [y.dense().float().cpu()]
        if backward:
            g = fixed_grad()(y.features)
            y.features.backward(g)
            got += [x.features.grad.float().cpu(), layer.weight.grad.float().cpu()]
    xd, mask = reference.to_dense(torch.from_numpy(cf).to(dtype).float(), torch.from_numpy(ci), shape)
    xd.requires_grad_(backward)
    if kind == "subm":
        ref = reference.dense_subm(xd, mask, ref_layer.weight)
    else:
        ref = reference.dense_conv(xd, ref_layer.weight, stride=2, padding=1)
    refs = [ref.detach()]
    if backward:
        oi = y.indices.cpu().long()
        ref_rows = ref[0].permute(1, 2, 3, 0)[oi[:, 1], oi[:, 2], oi[:, 3]]
        ref_rows.backward(g.float().cpu())
        ii = torch.from_numpy(ci).long()
        refs += [xd.grad[0].permute(1, 2, 3, 0)[ii[:, 1], ii[:, 2], ii[:, 3]], ref_layer.weight.grad]
    err = max(reference.rel_error(a, b) for a, b in zip(got, refs))
    tol = reference.TF32_TOLERANCE if dtype_name == "tf32" else reference.TOLERANCE[dtype]
    what = f"{case} {route.name} {dtype_name} vs dense F.conv3d, crop {'x'.join(map(str, CROP))}"
    return Check("layers", what + (" (out, dX, dW)" if backward else " (out)"), err, tol, f"{len(ci)} voxels")
