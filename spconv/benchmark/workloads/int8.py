"""``layers`` rows of int8 inference on the ``basic`` scan: a SubM 3x3x3 64->64 layer (map cached) and the
``basic`` network's forward, int8 next to FP32 in the same run, with the int8 rate (2 * products / time) against
the FP32 peak (torch.mm 2048^3) of the same run. The int8 modules are ``quantization.quantized.SparseConv``
built from the float layers with scales from one FP32 pass (max |value| / 127), as a calibrated PTQ gives."""
import functools
import warnings
from typing import List

import torch

import spconv.pytorch as sp
from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.results import Check
from spconv.benchmark.network import build_basic_net
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import time_fn
from spconv.benchmark.workloads.common import Context, Task, measurement, sparse_tensor
from spconv.pytorch import _int8, _route
from spconv.pytorch.quantization.quantized import SparseConv as QSparseConv
from spconv.pytorch.quantization.utils import conv_init_args

C = 64


def tasks(ctx: Context) -> List[Task]:
    from spconv.benchmark.workloads.basic import basic_scan
    if "fp32" not in ctx.dtypes:
        return []
    chosen = chosen_route_name(ctx.device)
    scan = functools.partial(basic_scan, ctx.data, ctx.quick, ctx.seed)
    return [Task(f"layers int8 {route.name}", functools.partial(_run, ctx, scan, route, route.name == chosen))
            for route in available_routes(ctx.device, with_cpu=ctx.with_cpu_route)]


def _run(ctx: Context, scan, route: Route, chosen: bool):
    with forced_native(route.force_native):
        _rows(ctx, scan, route, chosen)


def quantize_layer(conv, out_scale: float) -> QSparseConv:
    """The int8 module of a float conv: per-channel symmetric weights, the given output scale."""
    w = conv.weight.detach().float()
    ws = (w.abs().reshape(w.shape[0], -1).amax(1) / 127).clamp_min(1e-12).double()
    with warnings.catch_warnings():  # torch 2.13 flags its quantized tensors deprecated; the int8 API takes them
        warnings.filterwarnings("ignore", message="torch.quantize_per_tensor", category=UserWarning)
        qw = torch.quantize_per_channel(w, ws, torch.zeros_like(ws, dtype=torch.long), 0, torch.qint8)
    q = QSparseConv(**conv_init_args(conv), bias=conv.bias is not None, device=w.device)
    q.set_weight_bias(qw, conv.bias)
    q.scale = out_scale
    return q


def quantize_net(net, x):
    """(int8 network, input scale): each conv's output scale from a float pass over ``x``."""
    h = x
    mods = []
    with torch.no_grad():
        in_scale = float(x.features.abs().max()) / 127
        for m in net:
            h = m(h)
            if isinstance(m, sp.SparseConvolution):
                mods.append(quantize_layer(m, max(float(h.features.abs().max()) / 127, 1e-8)))
            else:
                mods.append(m)
    return sp.SparseSequential(*mods), in_scale


def _rows(ctx: Context, scan, route: Route, chosen: bool):
    s = scan()
    device = route.device
    gen = torch.Generator(device="cpu").manual_seed(ctx.seed)
    n = len(s.indices)
    baseline = ctx.mm(device, "fp32")
    peak = baseline.peak_gflops()
    # one SubM layer, map cached
    feats = torch.randn(n, C, generator=gen).numpy()
    torch.manual_seed(ctx.seed)
    layer = sp.SubMConv3d(C, C, 3, bias=False, indice_key="k").to(device)
    x = sparse_tensor(sp, feats, s.indices, s.shape, device, torch.float32)
    with torch.no_grad():
        y = layer(x)
    datas = y.indice_dict["k"]
    pairs = int(datas.indice_pair_num.sum().item())
    info = [ConvLayer(f"subm {C}->{C}", C, C, pairs, n, n, input_grad=False)]
    xs = float(x.features.abs().max()) / 127
    q = quantize_layer(layer, float(y.features.abs().max()) / 127)
    qx = x.replace_feature(torch.quantize_per_tensor(x.features, xs, 0, torch.qint8))
    qx.indice_dict = dict(y.indice_dict)
    with torch.no_grad():
        q(qx)  # builds the neighbour table the map caches
        x.indice_dict = dict(y.indice_dict)
        fp32 = time_fn(lambda: layer(x), device, ctx.plan)
        int8 = time_fn(lambda: q(qx), device, ctx.plan)
    case = f"int8 subm 3x3x3 {C}->{C} N={n} cached"
    measurement(ctx, "layers", case + " (fp32)", route, chosen, "fp32", "forward", n, info, fp32)
    measurement(ctx, "layers", case, route, chosen, "int8", "forward", n, info, int8, with_mm=False)
    with torch.no_grad():
        got, ref = q(qx).features.dequantize(), layer(x).features
    ctx.record.checks.append(Check("layers", f"int8 subm {C}->{C} {route.name} vs fp32 (relative L2)",
                                   float((got - ref).norm() / ref.norm()), 0.05, f"{n} voxels"))
    gops = 2 * pairs * C * C / (int8.median / 1e3) / 1e9
    path = ("gather, torch._int_mm, scatter-add" if _route.int8_route(device) == "native"
            else _int8.kernel_path(torch.zeros(1, 1, dtype=torch.int8, device=device)))
    ctx.note(f"int8 ({route.name}, {path}): SubM 3x3x3 {C}->{C} N={n} map cached: fp32 {fp32.median:.2f} ms, int8 "
             f"{int8.median:.2f} ms = {fp32.median / int8.median:.2f}x faster, {gops:.0f} GOP/s = "
             f"{gops / peak:.2f}x the fp32 peak ({peak:.0f} GFLOP/s this run: {baseline.peak_source()})")
    # the basic network's forward
    torch.manual_seed(ctx.seed)
    net = build_basic_net(sp, s.features.shape[1]).to(device).eval()
    xb = sparse_tensor(sp, s.features, s.indices, s.shape, device, torch.float32)
    qnet, in_scale = quantize_net(net, xb)
    with torch.no_grad():
        qxb = xb.replace_feature(torch.quantize_per_tensor(xb.features, in_scale, 0, torch.qint8))
        f32 = time_fn(lambda: net(xb), device, ctx.plan)
        i8 = time_fn(lambda: qnet(qxb), device, ctx.plan)
        ref = net(xb)
        err = float((qnet(qxb).features.dequantize() - ref.features).norm() / ref.features.norm())
    measurement(ctx, "layers", f"int8 basic network forward N={n} (fp32)", route, chosen, "fp32", "forward", n, [],
                f32, with_mm=False)
    measurement(ctx, "layers", f"int8 basic network forward N={n}", route, chosen, "int8", "forward", n, [], i8,
                with_mm=False)
    ctx.note(f"int8 ({route.name}): basic network forward N={n}: fp32 {f32.median:.1f} ms, int8 {i8.median:.1f} ms "
             f"= {f32.median / i8.median:.2f}x faster (maps built in both); int8 vs fp32 output relative L2 "
             f"{err:.4f} (scales from one fp32 pass, no calibration)")
    if chosen:  # the same bits on every route: measured once
        accuracy(ctx, s)


def _batch(feats, idx):
    return (torch.from_numpy(feats).float(), torch.from_numpy(idx).int(), 1)


def _quadrants(s):
    """The scan's four (y, x) quadrants, voxels kept at their coordinates (the traced graph keeps the scan's
    spatial shape): calibration crops whose ranges together span the scan's."""
    y, x = s.indices[:, 2], s.indices[:, 3]
    hy, hx = s.shape[1] // 2, s.shape[2] // 2
    out = []
    for top in (True, False):
        for left in (True, False):
            keep = ((y < hy) == top) & ((x < hx) == left)
            if keep.any():
                out.append(_batch(s.features[keep], s.indices[keep]))
    return out


def accuracy(ctx: Context, s) -> None:
    """PTQ through the documented FX workflow (spconv.pytorch.quantization), per-layer int8 vs FP32 error on the
    whole scan: the ``basic`` network (random weights scaled to unit-RMS outputs, as batch norms keep a trained
    network's) and an OpenPCDet-style VoxelBackBone8x after a few
    optimizer steps on the scan, both calibrated on its quadrants."""
    from spconv.benchmark.quant_models import BasicNetPTQ, VoxelBackBone8x, ptq, train_a_little, unit_scale_layers
    from spconv.pytorch.quantization import compare
    calib = _quadrants(s)
    full = _batch(s.features, s.indices)
    torch.manual_seed(ctx.seed)
    nets = {"basic network": unit_scale_layers(BasicNetPTQ(s.features.shape[1], list(s.shape)).eval(), calib[0])}
    if s.shape[0] >= 41:  # the backbone's z strides need 41 voxels
        backbone = VoxelBackBone8x(s.features.shape[1], list(s.shape))
        nets["VoxelBackBone8x"] = train_a_little(backbone, [full] * 3, steps=3)
    for name, net in nets.items():
        prepared, converted = ptq(net, calib)
        errs = compare.layer_errors(prepared, converted, *full)
        alone = compare.isolated_layer_errors(prepared, converted, *full)
        floors = compare.quantization_floors(prepared, converted, *full)
        worst = max(errs, key=errs.get)

        def row(e):
            return " ".join(f"{v:.4f}" for v in e.values())
        ctx.note(f"int8 PTQ {name} ({len(errs)} int8 layers, calibrated on the scan's {len(calib)} quadrants, "
                 f"evaluated on all of it): per-layer relative L2 vs fp32 {row(errs)}; worst {errs[worst]:.4f} "
                 f"({worst}); each layer alone (fed the float input) {row(alone)}; floor (the float output rounded "
                 f"at its best per-tensor int8 scale) {row(floors)}; worst alone / its floor "
                 f"{max(alone[n] / max(floors[n], 1e-12) for n in alone):.2f}")
