"""int8 sparse convs with the fused relu / residual add (spconv 2.x: ``quantization.intrinsic.quantized``)."""
from typing import Optional

import torch.ao.nn.intrinsic as nni

from spconv.core import Activation
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization import intrinsic as snni
from spconv.pytorch.quantization.quantized.conv import LinearPerChannelWeight, SparseConv

__all__ = ["SparseConvReLU", "SparseConvAddReLU", "LinearPerChannelWeightReLU"]


class SparseConvReLU(SparseConv):
    """relu(conv(x)) in int8: the relu is part of the kernel's epilogue."""
    _FLOAT_MODULE = snni.SpconvReLUNd
    _ACT = Activation.ReLU

    def _get_name(self):
        return "QuantizedSparseConvReLU"


class SparseConvAddReLU(SparseConv):
    """relu(conv(x) + residual) in int8: the qint8 residual (its own scale) is added in the kernel's epilogue."""
    _FLOAT_MODULE = snni.SpconvAddReLUNd
    _ACT = Activation.ReLU

    def forward(self, input: SparseConvTensor, add_input: Optional[SparseConvTensor] = None) -> SparseConvTensor:
        return self._int8_forward(input, add_input)

    def _get_name(self):
        return "QuantizedSparseConvAddReLU"


class LinearPerChannelWeightReLU(LinearPerChannelWeight):
    """relu(linear(x)) in int8."""
    _FLOAT_MODULE = nni.LinearReLU
    _ACT = "ReLU"

    def _get_name(self):
        return "QuantizedLinearPerChannelWeightReLU"
