"""Observers, fake quantizers and qconfigs for sparse tensors (spconv 2.x: ``quantization.fake_q``).

Activations are symmetric per-tensor qint8 (zero point 0, [-128, 127]), weights symmetric per output channel:
what the int8 kernels compute with (and what TensorRT deploys). The sparse observers and fake quantizers
observe ``.features`` of a SparseConvTensor and return the tensor with its features replaced.
"""
from typing import Any, Dict

import torch
from torch.ao.quantization.fake_quantize import (FakeQuantize, FixedQParamsFakeQuantize,
                                                 FusedMovingAvgObsFakeQuantize,
                                                 default_fused_per_channel_wt_fake_quant, default_weight_fake_quant)
from torch.ao.quantization.observer import (HistogramObserver, MinMaxObserver, MovingAverageMinMaxObserver,
                                            default_per_channel_weight_observer, default_placeholder_observer,
                                            default_weight_observer)
from torch.ao.quantization.qconfig import QConfig, QConfigAny, default_reuse_input_qconfig
from torch.ao.quantization.qconfig_mapping import _FIXED_QPARAMS_OP_TO_OBSERVER, QConfigMapping

from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.modules import PrintCurrentTime, PrintTensorMeta

__all__ = ["get_default_spconv_trt_ptq_qconfig", "get_default_spconv_trt_qat_qconfig",
           "get_default_spconv_qconfig_mapping"]


class _OnFeatures:
    """Applies the observer / fake quantizer to ``.features`` of a SparseConvTensor."""

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseFusedMovingAvgObsFakeQuantize(_OnFeatures, FusedMovingAvgObsFakeQuantize):
    pass


class SparseMovingAvgObsFakeQuantize(_OnFeatures, FakeQuantize):
    pass


class SparseHistogramObserver(_OnFeatures, HistogramObserver):
    pass


class SparseMinMaxObserver(_OnFeatures, MinMaxObserver):
    pass


_SYMMETRIC_INT8: Dict[str, Any] = dict(quant_min=-128, quant_max=127, dtype=torch.qint8, reduce_range=False,
                                       qscheme=torch.per_tensor_symmetric, eps=2 ** -12)

default_symmetric_spconv_ptq_qconfig = QConfig(activation=SparseHistogramObserver.with_args(**_SYMMETRIC_INT8),
                                               weight=default_per_channel_weight_observer)

default_symmetric_spconv_qat_qconfig = QConfig(
    activation=SparseFusedMovingAvgObsFakeQuantize.with_args(observer=MovingAverageMinMaxObserver,
                                                             **_SYMMETRIC_INT8),
    weight=default_fused_per_channel_wt_fake_quant)


def get_default_spconv_trt_ptq_qconfig(backend=None, version=None) -> QConfig:
    return default_symmetric_spconv_ptq_qconfig


def get_default_spconv_trt_qat_qconfig(backend=None, version=None) -> QConfig:
    return default_symmetric_spconv_qat_qconfig


def get_default_spconv_qconfig_mapping(is_qat: bool, backend: str = "fbgemm", version: int = 0) -> QConfigMapping:
    """torch's default QConfigMapping with the sparse symmetric qconfig as the global one (PTQ: histogram
    observers; QAT: fused moving-average fake quantizers)."""
    qconfig = get_default_spconv_trt_qat_qconfig() if is_qat else get_default_spconv_trt_ptq_qconfig()
    default_weight = default_weight_fake_quant if is_qat else default_weight_observer
    # Per-channel weights of transposed dense convs are not supported by fbgemm / x86.
    qconfig_transpose = (QConfig(activation=qconfig.activation, weight=default_weight)
                         if backend in ("fbgemm", "x86") else qconfig)
    # LayerNorm keeps float weights; sharing the activation observer avoids a quantize/dequantize pair.
    qconfig_layernorm = QConfig(activation=qconfig.activation, weight=default_placeholder_observer)
    mapping = QConfigMapping().set_global(qconfig).set_object_type("reshape", default_reuse_input_qconfig)
    for t in (torch.nn.ConvTranspose1d, torch.nn.ConvTranspose2d, torch.nn.ConvTranspose3d,
              torch.nn.functional.conv_transpose1d, torch.nn.functional.conv_transpose2d,
              torch.nn.functional.conv_transpose3d):
        mapping.set_object_type(t, qconfig_transpose)
    mapping.set_object_type(torch.nn.functional.layer_norm, qconfig_layernorm)
    mapping.set_object_type(torch.nn.LayerNorm, qconfig_layernorm)
    # Ops with fixed output ranges (sigmoid, tanh, ...) keep their fixed qparams.
    fixed: Dict[Any, QConfigAny] = {}
    for op, observer in _FIXED_QPARAMS_OP_TO_OBSERVER.items():
        if observer not in fixed:
            act = FixedQParamsFakeQuantize.with_args(observer=observer) if is_qat else observer
            fixed[observer] = QConfig(activation=act, weight=default_weight)
        mapping.set_object_type(op, fixed[observer])
    if backend == "onednn":
        for t in (torch.nn.Linear, torch.nn.LeakyReLU, torch.nn.functional.leaky_relu, torch.nn.Tanh,
                  torch.nn.functional.tanh):
            mapping.set_object_type(t, qconfig)
    mapping.set_object_type(PrintTensorMeta, None)
    mapping.set_object_type(PrintCurrentTime, None)
    return mapping
