"""spconv 2.x's documented PTQ workflow, the converted model run through the GPU code wherever it runs
(``gpu_place``: the HIP CPU build, and a GPU when there is one), on both int8 routes (the table kernel, and the
native one: gather -> int8 GEMM -> scatter-add): the same int8 bits as the CPU route, with at most one
device->host copy per kernel map."""
import copy
import warnings

import torch

from spconv import _backend
from spconv.benchmark.routes import forced_native
from spconv.benchmark.quant_models import FusibleBlock, VoxelBackBone8x, ptq, random_scene, train_a_little
from support.nets import trained_residual_net

warnings.filterwarnings("ignore", message=".*quantiz.*")
warnings.filterwarnings("ignore", category=DeprecationWarning)


def _run(place, model, inputs, native=False):
    """The GPU code's result (on the CPU), the glue's device->host copies and the op names of one run."""
    debug = _backend.debug_library(place.ops)
    with torch.no_grad():
        before = debug.host_copy_count()
        with place.active(), forced_native(native):
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                out = model(*inputs)
        copies = debug.host_copy_count() - before
    return out.cpu(), copies, [e.name for e in prof.events()]


def _maps_read(place, names):
    """The maps read on the host: every regular map when built, a submanifold one when its pairs are first used."""
    return sum(names.count(place.ops.name + "::" + op)
               for op in ("get_indice_pairs", "strided_kernel_map", "subm_map_pairs"))


def _check_gpu_routes(place, converted, inputs, n_convs, float_tail=False):
    """The fused route (the table kernel) and the native one (SPCONV_FORCE_NATIVE: gather -> int8 GEMM ->
    scatter-add) give the CPU route's bits, with one device->host copy per kernel map built. ``float_tail``: the
    model ends in a float op after the int8 layers (log_softmax), which a GPU computes with its own ATen kernel:
    there within its rounding (one int8 step of a logit is far more)."""
    # The GPU code's copy, made before the CPU's run (an int8 conv keeps the filters of its first run, on that
    # run's device), and its inputs at the place. (The model's first quantize_per_tensor rounds x / scale on a GPU
    # and x * (1 / scale) on the CPU: these inputs give the same int8 values both ways.)
    model = copy.deepcopy(converted).to(place.device)
    at_place = [place.to(t) if isinstance(t, torch.Tensor) else t for t in inputs]
    with torch.no_grad():
        cpu = converted(*inputs)

    def same(gpu):
        if float_tail and place.device.type == "cuda":
            torch.testing.assert_close(gpu, cpu, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(cpu, gpu)

    fused, copies, names = _run(place, model, at_place)
    same(fused)
    assert names.count(place.ops.name + "::quantized_conv") == n_convs
    assert copies == _maps_read(place, names)
    # the int8 table kernel takes the SubM tables as built
    assert names.count(place.ops.name + "::subm_map_pairs") == 0
    native, copies, names = _run(place, model, at_place, native=True)
    same(native)
    assert names.count(place.ops.name + "::quantized_conv") == 0 and "aten::_int_mm" in names
    assert copies == _maps_read(place, names)


def test_residual_net_int8_through_the_hip_code(gpu_place):
    net, batches = trained_residual_net(FusibleBlock, 5, 3, 2)
    _, converted = ptq(net, batches[:2])
    # eight int8 convs; maps: subm at 28x28 shared by three convs, then four strided convs
    _check_gpu_routes(gpu_place, converted, batches[2], 8, float_tail=True)


def test_voxel_backbone_int8_through_the_hip_code(gpu_place):
    g = torch.Generator().manual_seed(6)
    shape = [41, 32, 28]
    scenes = [random_scene(g, shape, 600) for _ in range(3)]
    m = VoxelBackBone8x(4, shape)
    train_a_little(m, scenes, steps=2)
    _, converted = ptq(m, scenes[:2])
    _check_gpu_routes(gpu_place, converted, scenes[2], 12)
