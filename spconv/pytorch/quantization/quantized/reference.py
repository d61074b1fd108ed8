"""The reference quantized sparse conv (spconv 2.x: ``quantization.quantized.reference``): float weights with
their quantization parameters; the forward runs the float conv on the quantized-then-dequantized weight.
``convert_fx`` produces it and lowers it to ``quantized.SparseConv``; ``get_quantized_weight()`` gives the int8
per-channel weight for deployment."""
from typing import Any, Dict, Optional

import torch
from torch.ao.nn.quantized.reference.modules.utils import ReferenceQuantizedModule

from spconv.core import Activation
from spconv.pytorch.conv import SparseConvolution
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization.utils import conv_init_args


class SpConv(SparseConvolution, ReferenceQuantizedModule):
    _IS_REFERENCE = True

    def __init__(self, ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, subm=False, output_padding=0, transposed=False, inverse=False, indice_key=None,
                 algo=None, fp32_accum=None, record_voxel_count=False, act_type=Activation.None_, act_alpha=0,
                 act_beta=0, name=None, device=None, dtype=None, weight_qparams: Optional[Dict[str, Any]] = None):
        SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                   groups, bias, subm, output_padding, transposed, inverse, indice_key, algo,
                                   fp32_accum, record_voxel_count, act_type, act_alpha, act_beta, name=name,
                                   device=device, dtype=dtype)
        self._init_weight_qparams(weight_qparams, device)

    def forward(self, x: SparseConvTensor, add_input: Optional[SparseConvTensor] = None) -> SparseConvTensor:
        return self._conv_forward(self.training, x, self.get_weight(), self.bias, add_input=add_input)

    def _get_name(self):
        return "QuantizedSparseConv(Reference)"

    @classmethod
    def from_float(cls, float_conv: SparseConvolution, weight_qparams: Dict[str, Any]):
        ref = cls(**conv_init_args(float_conv), bias=float_conv.bias is not None, name=float_conv.name,
                  device=float_conv.weight.device, dtype=float_conv.weight.dtype, weight_qparams=weight_qparams)
        ref.weight = torch.nn.Parameter(float_conv.weight.detach())
        if float_conv.bias is not None:
            ref.bias = torch.nn.Parameter(float_conv.bias.detach())
        counter = float_conv.get_max_num_voxels()
        if counter is not None:
            ref.get_max_num_voxels()[:] = counter
        return ref
