"""``backbone``: OpenPCDet's VoxelBackBone8x as a detector runs it on the basic workload's scan: SubM and strided
convs with BatchNorm and ReLU, every kernel map built inside, and the BEV map from ``dense()``. Inference forward
(eval mode) and a training step (train mode); the BEV map of a cropped window is checked against the same network
run densely (F.conv3d, BatchNorm, ReLU on the dense grid)."""
import functools
from typing import List

import torch

import spconv.pytorch as sp
from spconv.benchmark import reference, scenes
from spconv.benchmark.deploy_models import VoxelBackBone8x
from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.results import Check
from spconv.benchmark.routes import Route, available_routes, chosen_route_name, forced_native
from spconv.benchmark.timing import Plan, time_fn, time_train_step
from spconv.benchmark.workloads.basic import basic_scan
from spconv.benchmark.workloads.common import DTYPES, Context, Task, fixed_grad, measurement

# Dense-reference window (z, y, x): 32 levels leave the last conv (3 x 1 x 1, stride 2 in z, no padding) one.
CROP = (32, 64, 64)


def tasks(ctx: Context) -> List[Task]:
    chosen = chosen_route_name(ctx.device)
    route = next(r for r in available_routes(ctx.device) if r.name == chosen)
    dtype_name = ctx.dtypes[0]
    return [Task(f"backbone {route.name} {dtype_name}", functools.partial(_run_one, ctx, route, dtype_name))]


def trace_convs(net: VoxelBackBone8x, features: torch.Tensor, indices: torch.Tensor) -> List[ConvLayer]:
    """Runs the network once and reads each conv's pair count from the kernel map it used."""
    layers: List[ConvLayer] = []

    def record(name, mod, inp, out):
        pairs = int(out.indice_dict[mod.indice_key].indice_pair_num.sum().item())
        layers.append(ConvLayer(name, mod.in_channels, mod.out_channels, pairs, inp[0].indices.shape[0],
                                out.indices.shape[0], input_grad=bool(layers)))

    convs = [(n, m) for n, m in net.named_modules() if isinstance(m, (sp.SubMConv3d, sp.SparseConv3d))]
    hooks = [m.register_forward_hook(functools.partial(record, n)) for n, m in convs]
    try:
        with torch.no_grad():
            net(features, indices)
    finally:
        for h in hooks:
            h.remove()
    return layers


def _run_one(ctx: Context, route: Route, dtype_name: str):
    scan = basic_scan(ctx.data, ctx.quick, ctx.seed)
    device, dtype = route.device, DTYPES[dtype_name]
    torch.manual_seed(ctx.seed)
    net = VoxelBackBone8x(scan.features.shape[1], scan.shape).to(device, dtype)
    features = torch.from_numpy(scan.features).to(device, dtype)
    indices = torch.from_numpy(scan.indices).to(device)
    case = f"VoxelBackBone8x, {scan.label}"
    plan = ctx.plan
    with forced_native(route.force_native):
        net.eval()
        layers = trace_convs(net, features, indices)
        with torch.no_grad():
            fwd = time_fn(lambda: net(features, indices), device, Plan(max(plan.warmup - 1, 0), plan.iters))
        measurement(ctx, "backbone", case, route, True, dtype_name, "forward", scan.voxels, layers, fwd)
        net.train()  # BatchNorm on batch statistics, as in training
        train = time_train_step(lambda: net(features, indices), fixed_grad(), device, plan,
                                zero_grad=lambda: net.zero_grad(set_to_none=True))
        for pass_name in ("backward", "forward_backward"):
            measurement(ctx, "backbone", case, route, True, dtype_name, pass_name, scan.voxels, layers,
                        train[pass_name])
    ctx.record.checks.append(_dense_check(ctx, scan, route, dtype_name))


def _dense_check(ctx: Context, scan, route: Route, dtype_name: str) -> Check:
    """The BEV map of the network (eval mode, the benchmark's weights) on a cropped window vs the same modules
    run densely on that window's grid, in FP32 (FP64 for FP64)."""
    origin = scenes.crop_window(scan.indices, CROP, seed=ctx.seed)
    f, i, shape = scenes.crop(scan.features, scan.indices, origin, CROP)
    dtype = DTYPES[dtype_name]
    ref_dtype = torch.float64 if dtype == torch.float64 else torch.float32
    torch.manual_seed(ctx.seed)
    net = VoxelBackBone8x(scan.features.shape[1], shape).eval()
    with torch.no_grad(), forced_native(route.force_native):
        got = net.to(route.device, dtype)(torch.from_numpy(f).to(route.device, dtype),
                                           torch.from_numpy(i).to(route.device)).to(ref_dtype).cpu()
        net = net.cpu().to(ref_dtype)
        xd, mask = reference.to_dense(torch.from_numpy(f).to(dtype).to(ref_dtype), torch.from_numpy(i), shape)
        stages = [net.conv_input, net.conv1, net.conv2, net.conv3, net.conv4, net.conv_out]
        ref, _ = reference.dense_sparse_sequential([m for s in stages for m in s.modules()
                                                    if not isinstance(m, sp.SparseSequential)], xd, mask)
    ref = ref.reshape(got.shape)
    what = f"{route.name} {dtype_name} BEV map vs the network run densely, crop {'x'.join(map(str, CROP))}"
    return Check("backbone", what, reference.rel_error(got, ref), reference.TOLERANCE[dtype], f"{len(i)} voxels")
