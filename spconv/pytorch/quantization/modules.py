"""spconv 2.x: ``quantization.modules``."""
import torch

from spconv.pytorch.core import SparseConvTensor


class ConvBatchNormAddAct(torch.nn.Module):
    """conv -> bn -> (+ x_add) -> act, a residual unit written as one module."""

    def __init__(self, conv, bn: torch.nn.BatchNorm1d, act: torch.nn.ReLU) -> None:
        super().__init__()
        self.conv = conv
        self.bn = bn
        self.act = act

    def forward(self, x: SparseConvTensor, x_add: SparseConvTensor):
        x = self.conv(x)
        x = x.replace_feature(self.bn(x.features))
        return self.act(x.replace_feature(x.features + x_add.features))
