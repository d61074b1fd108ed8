"""Networks for the deployment path (torch.export -> AOTInductor -> C++): the benchmark's ``basic`` network
and an OpenPCDet-style VoxelBackBone8x, each taking ``(features, indices[, batch_size])`` and building the
SparseConvTensor inside forward, as a deployed detector does."""
from functools import partial
from typing import List, Sequence

import torch
from torch import nn

import spconv.pytorch as sp
from spconv.benchmark.network import build_basic_net


def _post_act_block(cin, cout, k, indice_key, stride=1, padding=0, conv_type="subm"):
    """OpenPCDet's post_act_block: conv (no bias) -> BatchNorm1d(eps=1e-3, momentum=0.01) -> ReLU."""
    if conv_type == "subm":
        conv = sp.SubMConv3d(cin, cout, k, bias=False, indice_key=indice_key)
    else:
        conv = sp.SparseConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=indice_key)
    return sp.SparseSequential(conv, nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())


class VoxelBackBone8x(nn.Module):
    """OpenPCDet's VoxelBackBone8x (channels 16-32-64-64, 128 out) with HeightCompression: returns the BEV map
    ``[B, 128 * D, H, W]``."""

    def __init__(self, input_channels: int, sparse_shape: Sequence[int]):
        super().__init__()
        self.sparse_shape = list(sparse_shape)
        norm = partial(nn.BatchNorm1d, eps=1e-3, momentum=0.01)
        block = _post_act_block
        self.conv_input = sp.SparseSequential(
            sp.SubMConv3d(input_channels, 16, 3, padding=1, bias=False, indice_key="subm1"), norm(16), nn.ReLU())
        self.conv1 = sp.SparseSequential(block(16, 16, 3, "subm1"))
        self.conv2 = sp.SparseSequential(block(16, 32, 3, "spconv2", 2, 1, "spconv"), block(32, 32, 3, "subm2"),
                                         block(32, 32, 3, "subm2"))
        self.conv3 = sp.SparseSequential(block(32, 64, 3, "spconv3", 2, 1, "spconv"), block(64, 64, 3, "subm3"),
                                         block(64, 64, 3, "subm3"))
        self.conv4 = sp.SparseSequential(block(64, 64, 3, "spconv4", 2, (0, 1, 1), "spconv"),
                                         block(64, 64, 3, "subm4"), block(64, 64, 3, "subm4"))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(64, 128, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            norm(128), nn.ReLU())

    def forward(self, features: torch.Tensor, indices: torch.Tensor, batch_size: int = 1) -> torch.Tensor:
        x = sp.SparseConvTensor(features, indices, self.sparse_shape, batch_size)
        x = self.conv4(self.conv3(self.conv2(self.conv1(self.conv_input(x)))))
        dense = self.conv_out(x).dense()
        n, c, d, h, w = dense.shape
        return dense.view(n, c * d, h, w)


class BasicNet(nn.Module):
    """The benchmark's ``basic`` network (spconv's bench_basic); returns the last layer's features and
    coordinates."""

    def __init__(self, input_channels: int, sparse_shape: Sequence[int]):
        super().__init__()
        self.sparse_shape = list(sparse_shape)
        self.net = build_basic_net(sp, input_channels)

    def forward(self, features: torch.Tensor, indices: torch.Tensor, batch_size: int = 1):
        out = self.net(sp.SparseConvTensor(features, indices, self.sparse_shape, batch_size))
        return out.features, out.indices


MODELS = {"backbone8x": VoxelBackBone8x, "basic": BasicNet}


def build(name: str, input_channels: int, sparse_shape: List[int], seed: int = 0) -> nn.Module:
    """The named network in eval mode with seeded weights and non-trivial BatchNorm statistics."""
    if name not in MODELS:
        raise ValueError(f"name must be one of {sorted(MODELS)}, got {name!r}")
    torch.manual_seed(seed)
    model = MODELS[name](input_channels, sparse_shape)
    gen = torch.Generator().manual_seed(seed + 1)
    for m in model.modules():
        if isinstance(m, nn.BatchNorm1d):
            with torch.no_grad():
                m.running_mean.uniform_(-0.1, 0.1, generator=gen)
                m.running_var.uniform_(0.5, 1.5, generator=gen)
                m.weight.uniform_(0.5, 1.5, generator=gen)
                m.bias.uniform_(-0.1, 0.1, generator=gen)
    return model.eval()
