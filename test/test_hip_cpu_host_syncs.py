"""The GPU path synchronises with the host at most once per kernel map it builds, and never per layer:
get_indice_pairs (strided_kernel_map for a layer) makes one device->host copy (its checks, the output count and the pairs per offset, returned as
map_info; a submanifold map built for a layer makes it when its pairs are first used: subm_map_pairs), and
the convolutions, pools, fused tables and backward passes that use the map check it on the host from map_info.
Counted on the GPU code run on the CPU (HIP CPU build): the glue's copies (host_copy_count) and, from the
profiler, every ATen op that synchronises a GPU stream (item, nonzero, masked_select, ...)."""
import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from spconv import _backend, constants
from support.launch_counts import SYNCING_OPS
from support.sites import coords

pytestmark = pytest.mark.hip_cpu

SHAPE = [12, 11, 10]


class Net(nn.Module):
    """Every layer kind that uses a kernel map: submanifold (three sharing a map, one grouped), strided, max and
    avg pool, inverse convolutions back through both."""

    def __init__(self):
        super().__init__()
        self.body = spconv.SparseSequential(
            spconv.SubMConv3d(4, 8, 3, indice_key="s1"), nn.ReLU(),
            spconv.SubMConv3d(8, 8, 3, indice_key="s1"), nn.ReLU(),
            spconv.SubMConv3d(8, 8, 3, groups=4, indice_key="s1"),
            spconv.SparseConv3d(8, 16, 3, 2, 1, indice_key="d1"), nn.ReLU(),
            spconv.SparseMaxPool3d(2, 2, indice_key="p1"),
            spconv.SubMConv3d(16, 16, 3, indice_key="s3"),
            spconv.SparseInverseConv3d(16, 8, 2, indice_key="p1"),
            spconv.SparseInverseConv3d(8, 8, 3, indice_key="d1"),
            spconv.SparseAvgPool3d(3, 1, 1))

    def forward(self, x):
        return self.body(x)


def counted_run(hip_cpu, net, x):
    before = _backend.debug_library(hip_cpu).host_copy_count()
    with torch.profiler.profile() as prof:
        feats = x.features.clone().requires_grad_(True)
        out = net(spconv.SparseConvTensor(feats, x.indices, x.spatial_shape, x.batch_size))
        out.features.square().sum().backward()
    names = [e.name for e in prof.events()]
    maps_built = sum(names.count(hip_cpu.name + "::" + op)
                     for op in ("get_indice_pairs", "strided_kernel_map", "subm_kernel_map"))
    return _backend.debug_library(hip_cpu).host_copy_count() - before, maps_built, sorted(n for n in names if n in SYNCING_OPS), names


@pytest.mark.parametrize("force_native", [False, True], ids=["fused", "native"])
def test_one_host_copy_per_map_none_per_layer(hip_cpu, force_native):
    torch.manual_seed(0)
    idx = coords(SHAPE, 2, 300, seed=5)
    x = spconv.SparseConvTensor(torch.randn(idx.shape[0], 4), idx, SHAPE, 2)
    net = Net()
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with _backend.gpu_code_on_cpu(hip_cpu.name):
            copies, maps_built, syncing, names = counted_run(hip_cpu, net, x)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    ran = {n.split("::")[1] for n in names if n.startswith(hip_cpu.name + "::")}
    layer_ops = ({"indice_conv", "indice_conv_backward", "indice_conv_grouped", "indice_conv_grouped_backward"}
                 if force_native else
                 {"build_fused_map", "fused_conv", "fused_conv_backward", "grouped_conv", "grouped_conv_backward"})
    assert layer_ops | {"indice_maxpool_table", "indice_maxpool_table_backward", "indice_avgpool_table",
                        "indice_avgpool_table_backward"} <= ran, sorted(ran)
    assert maps_built == 5  # s1, d1, p1, s3 and the avg pool's (the inverse convs reuse d1 and p1)
    # At most one copy per map: on the fused route s3's map (one SubM conv, forward and backward on its table)
    # never reads its pairs; s1's does, for the grouped conv.
    assert copies == maps_built - (0 if force_native else 1)
    assert not syncing, syncing
    if not force_native:
        # Nothing built twice: the fused tables of s1 and s3 (forward, with their masks and order), of d1 and p1
        # (the strided builder writes both directions) and of d1 and p1 reversed (d1's dinput, the inverse convs'
        # forwards) are the map builders' own; the SubM convs' dinput reads their forward tables mirrored; only
        # s1's reversed one (the grouped conv's) comes from the pairs.
        count = {op: names.count(hip_cpu.name + "::" + op)
                 for op in ("fused_map_masks", "build_fused_map", "subm_map_pairs")}
        assert count == {"fused_map_masks": 4, "build_fused_map": 1, "subm_map_pairs": 1}, count


def test_ops_without_map_info_check_on_the_device(hip_cpu):
    """The other side of the contract: a map without its host record is checked by the op itself, one copy per
    call (what every layer cost before map_info), and a map_info that contradicts the op's sizes is refused."""
    idx = coords(SHAPE, 1, 120, seed=2)
    args = (idx, 1, SHAPE, SHAPE, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    _, pin, pout, poff, info, _ = hip_cpu.get_indice_pairs(*args)
    x, w = torch.randn(idx.shape[0], 4), torch.randn(27, 4, 5)
    before = _backend.debug_library(hip_cpu).host_copy_count()
    ref = hip_cpu.indice_conv(x, w, pin, pout, poff, idx.shape[0])
    assert _backend.debug_library(hip_cpu).host_copy_count() - before == 1
    before = _backend.debug_library(hip_cpu).host_copy_count()
    assert torch.equal(hip_cpu.indice_conv(x, w, pin, pout, poff, idx.shape[0], info), ref)
    assert _backend.debug_library(hip_cpu).host_copy_count() == before
    with pytest.raises(ValueError, match="map_info says"):
        hip_cpu.indice_conv(x[:-1], w, pin, pout, poff, idx.shape[0], info)
    with pytest.raises(ValueError, match="map_info must be"):
        hip_cpu.indice_conv(x, w, pin, pout, poff, idx.shape[0], info[:-1])
    with pytest.raises(ValueError, match="pair_offsets must start at 0 and end"):
        hip_cpu.indice_conv(x, w, pin[:-1], pout[:-1], poff, idx.shape[0], info)
