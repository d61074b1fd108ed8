"""Quantization-aware-training sparse convs (spconv 2.x: ``quantization.intrinsic.qat``): the float conv with a
fake-quantized weight; the conv-bn ones train their batch norm through the folded weight (``freeze_bn_stats`` /
``update_bn_stats``) and fold it for good in ``to_float``."""
import math
from typing import Optional

import torch
import torch.ao.nn.intrinsic as nni
from torch import nn
from torch.nn import init

from spconv.core import Activation
from spconv.pytorch.conv import SparseConvolution
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization import intrinsic as snni
from spconv.pytorch.quantization.utils import conv_init_args, fuse_spconv_bn_weights


def _float_conv(qat) -> SparseConvolution:
    conv = SparseConvolution(**conv_init_args(qat), bias=qat.bias is not None, name=qat.name)
    conv.weight = nn.Parameter(qat.weight.detach())
    if qat.bias is not None:
        conv.bias = nn.Parameter(qat.bias.detach())
    return conv


class _QATConv(SparseConvolution):
    _FLOAT_MODULE = SparseConvolution
    _FLOAT_CONV_MODULE = SparseConvolution
    _FLOAT_RELU_MODULE: Optional[type] = None
    _ACT = Activation.None_

    def __init__(self, ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, subm=False, output_padding=0, transposed=False, inverse=False, indice_key=None,
                 algo=None, fp32_accum=None, record_voxel_count=False, act_type=Activation.None_, act_alpha=0,
                 act_beta=0, name=None, qconfig=None, device=None, dtype=None):
        super().__init__(ndim, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias, subm,
                         output_padding, transposed, inverse, indice_key, algo, fp32_accum, record_voxel_count,
                         act_type, act_alpha, act_beta, name=name, device=device, dtype=dtype)
        if not qconfig:
            raise ValueError("qconfig must be provided for a QAT module")
        self.qconfig = qconfig
        self.weight_fake_quant = qconfig.weight(factory_kwargs={"device": device, "dtype": dtype})

    def _act_type(self):
        return self._ACT if self._ACT != Activation.None_ else None

    def forward(self, input):
        return self._conv_forward(self.training, input, self.weight_fake_quant(self.weight), self.bias,
                                  act_type=self._act_type())

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant: bool = False):
        if not isinstance(mod, cls._FLOAT_MODULE):
            raise TypeError(f"qat.{cls.__name__}.from_float takes a {cls._FLOAT_MODULE.__name__}, got "
                            f"{type(mod).__name__}")
        qconfig = getattr(mod, "qconfig", None)
        if not qconfig:
            raise ValueError("the float module must have a qconfig")
        conv = mod[0] if isinstance(mod, nni._FusedModule) else mod
        qat = cls(**conv_init_args(conv), bias=conv.bias is not None, name=conv.name, qconfig=qconfig)
        qat.weight = conv.weight
        qat.bias = conv.bias
        return qat

    def to_float(self):
        conv = _float_conv(self)
        if self._FLOAT_RELU_MODULE is None:
            return conv
        fused = self._FLOAT_MODULE(conv, self._FLOAT_RELU_MODULE())
        fused.train(self.training)
        return fused


class SparseConv(_QATConv):
    """conv with a fake-quantized weight."""


class SparseConvReLU(_QATConv, nni._FusedModule):
    """conv -> relu."""
    _FLOAT_MODULE = snni.SpconvReLUNd
    _FLOAT_RELU_MODULE = nn.ReLU
    _ACT = Activation.ReLU


class SparseConvAddReLU(_QATConv, nni._FusedModule):
    """relu(conv(x) + residual)."""
    _FLOAT_MODULE = snni.SpconvAddReLUNd
    _FLOAT_RELU_MODULE = nn.ReLU
    _ACT = Activation.ReLU

    def forward(self, input, add_input):
        return self._conv_forward(self.training, input, self.weight_fake_quant(self.weight), self.bias,
                                  add_input=add_input, act_type=Activation.ReLU)


class _QATConvBn(SparseConvolution, nni._FusedModule):
    """conv + batch norm, trained with the bn folded into the fake-quantized weight (the one-pass approximation
    of torch's ConvBn: conv(x, fq(w * g / std)) / (g / std), then the bn on that)."""
    _version = 2
    _FLOAT_MODULE = snni.SpconvBnNd
    _FLOAT_CONV_MODULE = SparseConvolution
    _FLOAT_BN_MODULE = nn.BatchNorm1d
    _FLOAT_RELU_MODULE: Optional[type] = None
    _FUSED_FLOAT_MODULE: Optional[type] = None  # the fused float conv (+ relu) to_float gives
    _ACT = Activation.None_

    def __init__(self, ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, subm=False, output_padding=0, transposed=False, inverse=False, indice_key=None,
                 algo=None, fp32_accum=None, record_voxel_count=False, act_type=Activation.None_, act_alpha=0,
                 act_beta=0, name=None, eps=1e-05, momentum=0.1, freeze_bn=False, qconfig=None):
        SparseConvolution.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                   groups, False, subm, output_padding, transposed, inverse, indice_key, algo,
                                   fp32_accum, record_voxel_count, act_type, act_alpha, act_beta, name=name)
        if not qconfig:
            raise ValueError("qconfig must be provided for a QAT module")
        self.qconfig = qconfig
        self.freeze_bn = freeze_bn if self.training else True
        self.bn = nn.BatchNorm1d(out_channels, eps, momentum, True, True)
        self.weight_fake_quant = self.qconfig.weight()
        if bias:
            self.bias = nn.Parameter(torch.empty(out_channels))
        else:
            self.register_parameter("bias", None)
        self.reset_bn_parameters()
        if self.training and not freeze_bn:
            self.update_bn_stats()
        else:
            self.freeze_bn_stats()

    def reset_running_stats(self):
        self.bn.reset_running_stats()

    def reset_bn_parameters(self):
        self.bn.reset_running_stats()
        init.uniform_(self.bn.weight)
        init.zeros_(self.bn.bias)
        if self.bias is not None:
            bound = 1 / math.sqrt(self.in_channels // self.groups * math.prod(self.kernel_size))
            init.uniform_(self.bias, -bound, bound)

    def update_bn_stats(self):
        self.freeze_bn = False
        self.bn.training = True
        return self

    def freeze_bn_stats(self):
        self.freeze_bn = True
        self.bn.training = False
        return self

    def train(self, mode: bool = True):
        # A frozen bn stays in eval mode whatever model.train() says.
        self.training = mode
        if not self.freeze_bn:
            for module in self.children():
                module.train(mode)
        return self

    def _forward(self, input: SparseConvTensor, add_input: Optional[SparseConvTensor] = None) -> SparseConvTensor:
        std = torch.sqrt(self.bn.running_var + self.bn.eps)
        factor = self.bn.weight / std
        w = self.weight_fake_quant(self.weight * factor.reshape([-1] + [1] * (self.weight.dim() - 1)))
        out = self._conv_forward(self.training, input, w, None, act_type=Activation.None_)
        y = out.features / factor
        if self.bias is not None:
            y = y + self.bias
        y = self.bn(y)
        if add_input is not None:
            y = y + add_input.features
        if self._ACT == Activation.ReLU:
            y = torch.relu(y)
        return out.replace_feature(y)

    def forward(self, input):
        return self._forward(input)

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant: bool = False):
        if type(mod) is not cls._FLOAT_MODULE:
            raise TypeError(f"qat.{cls.__name__}.from_float takes a {cls._FLOAT_MODULE.__name__}, got "
                            f"{type(mod).__name__}")
        qconfig = getattr(mod, "qconfig", None)
        if not qconfig:
            raise ValueError("the float module must have a qconfig")
        conv, bn = mod[0], mod[1]
        qat = cls(**conv_init_args(conv), bias=conv.bias is not None, name=conv.name, eps=bn.eps,
                  momentum=bn.momentum, freeze_bn=False, qconfig=qconfig)
        qat.weight = conv.weight
        qat.bias = conv.bias
        qat.bn.weight = bn.weight
        qat.bn.bias = bn.bias
        qat.bn.running_mean = bn.running_mean
        qat.bn.running_var = bn.running_var
        qat.bn.num_batches_tracked = bn.num_batches_tracked
        return qat

    def to_float(self):
        """The float conv with the bn folded in (plus the relu for the relu variants)."""
        conv = _float_conv(self)
        conv.weight, conv.bias = fuse_spconv_bn_weights(conv.weight, conv.bias, self.bn.running_mean,
                                                        self.bn.running_var, self.bn.eps, self.bn.weight,
                                                        self.bn.bias)
        if self._FLOAT_RELU_MODULE is None:
            return conv
        fused = self._FUSED_FLOAT_MODULE(conv, self._FLOAT_RELU_MODULE())
        fused.train(self.training)
        return fused


class SparseConvBn(_QATConvBn):
    """conv -> bn."""


class SparseConvBnReLU(_QATConvBn):
    """conv -> bn -> relu."""
    _FLOAT_MODULE = snni.SpconvBnReLUNd
    _FLOAT_RELU_MODULE = nn.ReLU
    _FUSED_FLOAT_MODULE = snni.SpconvReLUNd
    _ACT = Activation.ReLU


class SparseConvBnAddReLU(_QATConvBn):
    """relu(bn(conv(x)) + residual)."""
    _FLOAT_MODULE = snni.SpconvBnAddReLUNd
    _FLOAT_RELU_MODULE = nn.ReLU
    _FUSED_FLOAT_MODULE = snni.SpconvAddReLUNd
    _ACT = Activation.ReLU

    def forward(self, input, add_input):
        return self._forward(input, add_input)
