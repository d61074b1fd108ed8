"""torch.export through the GPU code wherever it runs (``gpu_place``: the HIP CPU build, and a GPU when there is
one): the fused route's tables and convolutions and the GPU kernel maps trace with data-dependent sizes, and the
exported module gives the eager GPU route's bits at other voxel counts."""
import torch
from torch import nn

import spconv.pytorch as spconv
from spconv import deploy
from support.export_nets import inputs


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.net = spconv.SparseSequential(
            spconv.SubMConv3d(3, 8, 3, indice_key="s"), nn.BatchNorm1d(8), nn.ReLU(),
            spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d"), nn.BatchNorm1d(8), nn.ReLU(),
            spconv.SparseMaxPool3d(2, 2, indice_key="mp"), spconv.SparseInverseConv3d(8, 8, 2, indice_key="mp"),
            spconv.SparseInverseConv3d(8, 4, 3, indice_key="d"))

    def forward(self, features, indices):
        out = self.net(spconv.SparseConvTensor(features, indices, [10, 10, 12], 2))
        return out.features, out.indices


def test_export_through_the_gpu_code(gpu_place):
    torch.manual_seed(0)
    model = Net().eval().to(gpu_place.device)
    on = gpu_place.to
    # cuDNN / MIOpen off: eager batch norm then runs ATen's kernel, as the exported graph does (a no-op on the CPU)
    with gpu_place.active(), torch.backends.cudnn.flags(enabled=False):
        ep = deploy.export(model, *map(on, inputs(0, 0.2)))
        called = {str(n.target) for n in ep.graph.nodes if n.op == "call_function"}
        ns = gpu_place.ops.name
        assert {ns + ".get_indice_pairs.default", ns + ".fused_conv.default"} <= called, sorted(called)
        with torch.no_grad():
            for seed, density in ((1, 0.1), (2, 0.3)):
                feats, idx = map(on, inputs(seed, density))
                ref, out = model(feats, idx), ep.module()(feats, idx)
                assert all(torch.equal(a, b) for a, b in zip(out, ref)), (seed, density)
