"""``layers`` rows of grouped convolution on the ``basic`` scan (``--data``: a real one): depthwise SubM 3x3x3 and
groups 4 and 8 (C=128 -> 128) against the same layer with groups=1, all with the kernel map cached, plus a
roofline figure for the depthwise row: the bytes it must move (read the input rows once, write the output
rows once, read the neighbour table) per second, against the memory bandwidth of a large tensor copy measured
in the same run."""
import functools
from typing import List

import torch

import spconv.pytorch as sp
from spconv.benchmark import reference, scenes
from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.results import Check
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import time_fn, time_train_step
from spconv.benchmark.workloads.common import DTYPES, Context, Task, fixed_grad, measurement, sparse_tensor

C = 128
GROUPS = (128, 8, 4, 1)  # depthwise first; groups=1 is the yardstick of the grouped rows
COPY_BYTES = 256 << 20  # well beyond the last-level cache
CROP = (8, 24, 24)


def tasks(ctx: Context) -> List[Task]:
    from spconv.benchmark.workloads.basic import basic_scan
    chosen = chosen_route_name(ctx.device)
    scan = functools.partial(basic_scan, ctx.data, ctx.quick, ctx.seed)
    out = []
    for route in available_routes(ctx.device, with_cpu=ctx.with_cpu_route):
        for dtype_name in ctx.dtypes:
            if dtype_name == "tf32":
                continue
            out.append(Task(f"layers grouped C={C} {route.name} {dtype_name}",
                            functools.partial(_run, ctx, scan, route, route.name == chosen, dtype_name)))
    return out


def copy_bandwidth(device: torch.device, plan) -> float:
    """Bytes per second of ``dst.copy_(src)`` on ``COPY_BYTES`` (read + write counted)."""
    src = torch.ones(COPY_BYTES // 4, device=device)
    dst = torch.empty_like(src)
    stats = time_fn(lambda: dst.copy_(src), device, plan)
    return 2 * COPY_BYTES / (stats.median / 1e3)


def _layer(groups: int, device, dtype, seed: int):
    torch.manual_seed(seed)
    return sp.SubMConv3d(C, C, 3, groups=groups, bias=False, indice_key="k").to(device, dtype)


def _features_only(layer, x, datas):
    from spconv.pytorch import _grouped, _route
    from spconv.pytorch.functional import conv_features, weight_to_filters
    n = datas.out_indices.shape[0]
    if layer.groups == 1:
        return conv_features(x.features, weight_to_filters(layer.weight), datas.maps, n)
    return _route.conv_grouped(x.features, _grouped.weight_to_grouped_filters(layer.weight, layer.groups),
                               datas.maps, n)


def _name(groups: int) -> str:
    return "depthwise subm" if groups == C else f"subm g={groups}"


def _run(ctx: Context, scan, route: Route, chosen: bool, dtype_name: str):
    s = scan()
    device, dtype = route.device, DTYPES[dtype_name]
    gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
    feats = torch.randn(len(s.indices), C, generator=gen).numpy()
    n = len(s.indices)
    forward_ms, train_ms = {}, {}
    with forced_native(route.force_native):
        bandwidth = copy_bandwidth(device, ctx.plan)
        for g in GROUPS:
            layer = _layer(g, device, dtype, ctx.seed)
            x = sparse_tensor(sp, feats, s.indices, s.shape, device, dtype)
            with torch.no_grad():
                y = layer(x)
            datas = y.indice_dict["k"]
            pairs = int(datas.indice_pair_num.sum().item())
            # FLOPs of a grouped layer: each output channel reads Cin/groups inputs.
            info = [ConvLayer(f"{_name(g)} {C}->{C}", C // g, C, pairs, n, n, input_grad=True)]
            case = f"grouped {_name(g)} 3x3x3 {C}->{C} N={n} cached"
            with torch.no_grad():
                _features_only(layer, x, datas)  # builds the tables the map caches
                st = time_fn(lambda: _features_only(layer, x, datas), device, ctx.plan)
            forward_ms[g] = st.median
            measurement(ctx, "layers", case, route, chosen, dtype_name, "forward", n, info, st, with_mm=False)
            if g in (C, 4):
                xg = sparse_tensor(sp, feats, s.indices, s.shape, device, dtype, requires_grad=True)

                def zero():
                    layer.zero_grad(set_to_none=True)
                    xg.features.grad = None

                train = time_train_step(lambda: _features_only(layer, xg, datas), fixed_grad(), device, ctx.plan,
                                        zero)
                train_ms[g] = train["forward_backward"].median
                for pass_name in ("backward", "forward_backward"):
                    measurement(ctx, "layers", case, route, chosen, dtype_name, pass_name, n, info, train[pass_name],
                                with_mm=False)
            if g == C:
                kvol = datas.maps.kernel_volume
                elem = torch.tensor([], dtype=dtype).element_size()
                moved = 2 * n * C * elem + n * kvol * 4  # input rows once, output rows once, neighbour table
                achieved = moved / (st.median / 1e3)
                ctx.record.notes.append(
                    f"grouped roofline ({route.name} {dtype_name}): depthwise SubM 3x3x3 C={C} forward moves "
                    f"{moved / 1e6:.1f} MB in {st.median:.2f} ms = {achieved / 1e9:.2f} GB/s, "
                    f"{100 * achieved / bandwidth:.0f}% of the {bandwidth / 1e9:.2f} GB/s a "
                    f"{COPY_BYTES >> 20} MiB tensor copy reaches in this run")
    ctx.record.notes.append(
        f"grouped ({route.name} {dtype_name}, N={n}, map cached): forward groups=1 {forward_ms[1]:.2f} ms, "
        f"g=4 {forward_ms[4]:.2f} ms ({forward_ms[4] / forward_ms[1]:.2f}x), g=8 {forward_ms[8]:.2f} ms "
        f"({forward_ms[8] / forward_ms[1]:.2f}x), depthwise {forward_ms[C]:.2f} ms; depthwise forward+backward "
        f"{train_ms[C]:.2f} ms ({train_ms[C] / forward_ms[C]:.2f}x its forward)")
    ctx.record.checks.append(_dense_check(ctx, s, feats, route, dtype_name))


def _dense_check(ctx: Context, s, feats, route: Route, dtype_name: str) -> Check:
    """Depthwise and g=4 layers on a crop vs F.conv3d(groups=g) on its dense grid (outputs)."""
    origin = scenes.crop_window(s.indices, CROP, seed=ctx.seed)
    cf, ci, shape = scenes.crop(feats, s.indices, origin, CROP)
    dtype = DTYPES[dtype_name]
    err = 0.0
    with forced_native(route.force_native):
        for g in (C, 4):
            layer = _layer(g, route.device, dtype, ctx.seed)
            with torch.no_grad():
                got = layer(sparse_tensor(sp, cf, ci, shape, route.device, dtype)).dense().float().cpu()
                xd, mask = reference.to_dense(torch.from_numpy(cf).to(dtype).float(), torch.from_numpy(ci), shape)
                w = layer.weight.float().cpu().permute(0, 4, 1, 2, 3)
                ref = torch.nn.functional.conv3d(xd, w, padding=1, groups=g) * mask
            err = max(err, reference.rel_error(got, ref))
    return Check("layers", f"grouped depthwise and g=4 {route.name} {dtype_name} vs dense F.conv3d(groups=), crop "
                 f"{'x'.join(map(str, CROP))} (out)", err, reference.TOLERANCE[dtype], f"{len(ci)} voxels")
