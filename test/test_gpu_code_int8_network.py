"""spconv 2.x's documented PTQ workflow, the converted model run through the GPU code (HIP kernels and glue on
the HIP CPU runtime): the same int8 bits as the CPU route, with at most one device->host copy per kernel map."""
import warnings

import pytest
import torch

from spconv import _backend
from spconv.benchmark.routes import forced_native
from spconv.benchmark.quant_models import FusibleBlock, VoxelBackBone8x, ptq, random_scene, train_a_little
from support.nets import trained_residual_net

warnings.filterwarnings("ignore", message=".*quantiz.*")
warnings.filterwarnings("ignore", category=DeprecationWarning)

pytestmark = pytest.mark.hip_cpu


def _run_both(hip_cpu, converted, inputs, native=False):
    with torch.no_grad():
        cpu = converted(*inputs)
        before = _backend.debug_library(hip_cpu).host_copy_count()
        with _backend.gpu_code_on_cpu(hip_cpu.name), forced_native(native):
            with torch.profiler.profile() as prof:
                gpu = converted(*inputs)
        copies = _backend.debug_library(hip_cpu).host_copy_count() - before
    names = [e.name for e in prof.events()]
    return cpu, gpu, copies, names


def _maps_read(hip_cpu, names):
    """The maps read on the host: every regular map when built, a submanifold one when its pairs are first used."""
    return names.count(hip_cpu.name + "::get_indice_pairs") + names.count(hip_cpu.name + "::subm_map_pairs")


def _check_gpu_routes(hip_cpu, converted, inputs, n_convs):
    """The fused route (the table kernel) and the native one (SPCONV_FORCE_NATIVE: gather -> int8 GEMM ->
    scatter-add) give the CPU route's bits, with one device->host copy per kernel map built."""
    cpu, fused, copies, names = _run_both(hip_cpu, converted, inputs)
    assert torch.equal(cpu, fused)
    assert names.count(hip_cpu.name + "::quantized_conv") == n_convs
    assert copies == _maps_read(hip_cpu, names)
    assert names.count(hip_cpu.name + "::subm_map_pairs") == 0  # the int8 table kernel takes the SubM tables as built
    _, native, copies, names = _run_both(hip_cpu, converted, inputs, native=True)
    assert torch.equal(cpu, native)
    assert names.count(hip_cpu.name + "::quantized_conv") == 0 and "aten::_int_mm" in names
    assert copies == _maps_read(hip_cpu, names)


def test_residual_net_int8_through_the_hip_code(hip_cpu):
    net, batches = trained_residual_net(FusibleBlock, 5, 3, 2)
    _, converted = ptq(net, batches[:2])
    # eight int8 convs; maps: subm at 28x28 shared by three convs, then four strided convs
    _check_gpu_routes(hip_cpu, converted, batches[2], 8)


def test_voxel_backbone_int8_through_the_hip_code(hip_cpu):
    g = torch.Generator().manual_seed(6)
    shape = [41, 32, 28]
    scenes = [random_scene(g, shape, 600) for _ in range(3)]
    m = VoxelBackBone8x(4, shape)
    train_a_little(m, scenes, steps=2)
    _, converted = ptq(m, scenes[:2])
    _check_gpu_routes(hip_cpu, converted, scenes[2], 12)
