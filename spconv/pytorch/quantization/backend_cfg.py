"""torch.ao FX quantization configuration for sparse networks (spconv 2.x: ``quantization.backend_cfg``):
which patterns fuse (conv + bn (+ relu), a residual block's conv + bn + add + relu), how each module is
observed, its QAT and reference modules, and the lowering of reference modules to the int8 ones."""
import operator
from typing import Dict, List, NamedTuple, Optional, Tuple, Type

import torch
import torch.ao.nn.intrinsic as nni
import torch.ao.nn.quantized.reference as nnqr
import torch.nn.functional as F
from torch import nn
from torch.ao.nn.quantized.modules.utils import WeightedQuantizedModule
from torch.ao.quantization.backend_config import (BackendConfig, BackendPatternConfig, DTypeConfig,
                                                  ObservationType, get_tensorrt_backend_config)
from torch.ao.quantization.fx.custom_config import ConvertCustomConfig, PrepareCustomConfig
from torch.ao.quantization.fx.match_utils import MatchAllNode

from spconv.pytorch import conv as sconvmod
from spconv.pytorch.modules import (PrintCurrentTime, PrintTensorMeta, SparseBatchNorm, SparseIdentity, SparseReLU,
                                    SparseSyncBatchNorm, ToDense)
from spconv.pytorch.pool import ALL_POOL_LAYERS
from spconv.pytorch.quantization import intrinsic as snni
from spconv.pytorch.quantization.fuse_mapping import fuse_conv_bn, fuse_conv_bn_add_relu, fuse_conv_bn_relu
from spconv.pytorch.quantization.intrinsic import qat as snniqat
from spconv.pytorch.quantization.intrinsic import quantized as snniq
from spconv.pytorch.quantization import quantized as snnq
from spconv.pytorch.quantization.quantized import reference as snnqr

weighted_op_qint8_dtype_config = DTypeConfig(input_dtype=torch.qint8, output_dtype=torch.qint8,
                                             weight_dtype=torch.qint8, bias_dtype=torch.float)
non_weighted_op_qint8_dtype_config = DTypeConfig(input_dtype=torch.qint8, output_dtype=torch.qint8)
conv_dtype_configs = [weighted_op_qint8_dtype_config]

_CONV_ROOTS = [*sconvmod.DEFAULT_SPARSE_CONV_TYPES, sconvmod.SparseConvolution]
_RELUS = [nn.ReLU, F.relu, SparseReLU]
_ADDS = [torch.add, operator.add]
_OWN_OBSERVER = ObservationType.OUTPUT_USE_DIFFERENT_OBSERVER_AS_INPUT


class _ConvModules(NamedTuple):
    """The modules one conv class becomes: fused float, QAT and reference."""
    root: type
    reference: type = snnqr.SpConv
    fused_relu: type = snni.SpconvReLUNd
    fused_bn: type = snni.SpconvBnNd
    fused_bn_relu: type = snni.SpconvBnReLUNd
    fused_add_relu: type = snni.SpconvAddReLUNd
    fused_bn_add_relu: type = snni.SpconvBnAddReLUNd
    qat: type = snniqat.SparseConv
    relu_qat: type = snniqat.SparseConvReLU
    bn_qat: type = snniqat.SparseConvBn
    bn_relu_qat: type = snniqat.SparseConvBnReLU
    add_relu_qat: type = snniqat.SparseConvAddReLU
    bn_add_relu_qat: type = snniqat.SparseConvBnAddReLU


_CONVS = [_ConvModules(t) for t in _CONV_ROOTS]


def _conv_relu_fuser(is_qat, conv, relu):
    return snni.SpconvReLUNd(conv, relu)


def _conv_add_relu_fuser(is_qat, relu, add_pattern):
    _, conv, _ = add_pattern
    return snni.SpconvAddReLUNd(conv, relu)


def _bn_add_root(pattern):  # (relu, (add, (bn, conv), residual)) -> conv
    return pattern[1][1][1]


def _add_root(pattern):  # (relu, (add, conv, residual)) -> conv
    return pattern[1][1]


def _add_residual(pattern):
    return [pattern[1][2]]


def _observed(pattern, c: _ConvModules, dtype_configs, qat: Optional[type] = None) -> BackendPatternConfig:
    """A module that is observed on its own output and lowered through the reference conv."""
    cfg = (BackendPatternConfig(pattern).set_observation_type(_OWN_OBSERVER).set_dtype_configs(dtype_configs)
           .set_root_module(c.root).set_reference_quantized_module(c.reference))
    return cfg.set_qat_module(qat) if qat is not None else cfg


def _get_bn_spconv_configs(bn_cls, dtype_configs) -> List[BackendPatternConfig]:
    """conv + bn (+ relu) (+ add + relu) fusions for one batch-norm class."""
    configs = []
    for c in _CONVS:
        configs.append(BackendPatternConfig((c.root, bn_cls)).set_dtype_configs(dtype_configs)
                       .set_fuser_method(fuse_conv_bn).set_fused_module(c.fused_bn))
        for relu in _RELUS:
            configs.append(BackendPatternConfig((c.root, bn_cls, relu)).set_dtype_configs(dtype_configs)
                           .set_fuser_method(fuse_conv_bn_relu).set_fused_module(c.fused_bn_relu))
        for add in _ADDS:
            configs.append(BackendPatternConfig()._set_pattern_complex_format(
                (SparseReLU, (add, (bn_cls, c.root), MatchAllNode))).set_dtype_configs(dtype_configs)
                .set_fuser_method(fuse_conv_bn_add_relu)._set_root_node_getter(_bn_add_root)
                ._set_extra_inputs_getter(_add_residual).set_fused_module(c.fused_bn_add_relu))
    return configs


def _get_spconv_configs(dtype_configs) -> List[BackendPatternConfig]:
    configs = []
    for bn_cls in (SparseBatchNorm, nn.BatchNorm1d, SparseSyncBatchNorm):
        configs += _get_bn_spconv_configs(bn_cls, dtype_configs)
    for c in _CONVS:
        configs.append(_observed(c.root, c, dtype_configs, c.qat))
        configs.append(_observed(c.qat, c, dtype_configs))
        for relu in _RELUS:
            configs.append(BackendPatternConfig((c.root, relu)).set_dtype_configs(dtype_configs)
                           .set_fuser_method(_conv_relu_fuser).set_fused_module(c.fused_relu))
        for add in _ADDS:
            configs.append(BackendPatternConfig()._set_pattern_complex_format(
                (SparseReLU, (add, c.root, MatchAllNode))).set_dtype_configs(dtype_configs)
                .set_fuser_method(_conv_add_relu_fuser)._set_root_node_getter(_add_root)
                ._set_extra_inputs_getter(_add_residual).set_fused_module(c.fused_add_relu))
        # fused float modules -> their QAT modules; QAT modules -> observed, lowered through the reference conv
        configs.append(_observed(c.fused_relu, c, dtype_configs, c.relu_qat))
        configs.append(_observed(c.relu_qat, c, dtype_configs))
        configs.append(BackendPatternConfig(c.fused_bn).set_dtype_configs(dtype_configs).set_qat_module(c.bn_qat))
        configs.append(BackendPatternConfig(c.fused_bn_relu).set_dtype_configs(dtype_configs)
                       .set_qat_module(c.bn_relu_qat))
        configs.append(_observed(c.bn_qat, c, dtype_configs))
        configs.append(_observed(c.bn_relu_qat, c, dtype_configs))
        configs.append(_observed(c.fused_add_relu, c, dtype_configs, c.add_relu_qat))
        configs.append(BackendPatternConfig(c.fused_bn_add_relu).set_dtype_configs(dtype_configs)
                       .set_qat_module(c.bn_add_relu_qat))
        configs.append(_observed(c.add_relu_qat, c, dtype_configs))
        configs.append(_observed(c.bn_add_relu_qat, c, dtype_configs))
    return configs


def _get_share_observer_ops(dtype_configs) -> List[BackendPatternConfig]:
    """Modules whose output has their input's scale (densify, identity, pooling)."""
    share = ObservationType.OUTPUT_SHARE_OBSERVER_WITH_INPUT
    return [BackendPatternConfig(m).set_observation_type(share).set_dtype_configs(dtype_configs)
            for m in (ToDense, SparseIdentity, PrintCurrentTime, *ALL_POOL_LAYERS)]


# Lowering of reference modules to the int8 ones (prepare_spconv_torch_inference adds them to torch's maps).
_LowerMap = Dict[Type[nn.Module], Tuple[Type[nn.Module], Type[WeightedQuantizedModule]]]
SPCONV_STATIC_LOWER_FUSED_MODULE_MAP: _LowerMap = {
    snni.SpconvReLUNd: (snnqr.SpConv, snniq.SparseConvReLU),
}
# conv-add-relu reads two quantized inputs (the conv's and the residual): torch lowers those in its own pass.
SPCONV_STATIC_LOWER_FUSED_MODULE_TWO_INPUTS_MAP: _LowerMap = {
    snni.SpconvAddReLUNd: (snnqr.SpConv, snniq.SparseConvAddReLU),
}
SPCONV_STATIC_LOWER_MODULE_MAP: Dict[Type[nn.Module], Type[WeightedQuantizedModule]] = {
    snnqr.SpConv: snnq.SparseConv,
}


def get_spconv_backend_config(additional_bns: Optional[List[Type[nn.Module]]] = None) -> BackendConfig:
    """torch's TensorRT backend config plus the sparse patterns (``additional_bns``: more batch-norm classes
    that fuse into a conv)."""
    config = get_tensorrt_backend_config().set_backend_pattern_configs(
        _get_spconv_configs(conv_dtype_configs) + _get_share_observer_ops([non_weighted_op_qint8_dtype_config]))
    for bn_type in additional_bns or []:
        config.set_backend_pattern_configs(_get_bn_spconv_configs(bn_type, conv_dtype_configs))
    return config


def get_spconv_prepare_custom_config(additional_bns: Optional[List[Type[nn.Module]]] = None) -> PrepareCustomConfig:
    """The modules FX treats as leaves (their forward takes a SparseConvTensor and is not traced)."""
    cfg = PrepareCustomConfig()
    cfg.non_traceable_module_classes = [*sconvmod.DEFAULT_SPARSE_CONV_TYPES, SparseReLU, SparseBatchNorm,
                                        SparseSyncBatchNorm, PrintTensorMeta, PrintCurrentTime, SparseIdentity,
                                        ToDense, *ALL_POOL_LAYERS, *(additional_bns or [])]
    return cfg


def get_spconv_convert_custom_config() -> ConvertCustomConfig:
    cfg = ConvertCustomConfig()
    cfg.set_observed_to_quantized_mapping(snni.SpconvReLUNd, snniq.SparseConvReLU)
    cfg.set_observed_to_quantized_mapping(snni.SpconvAddReLUNd, snniq.SparseConvAddReLU)
    return cfg


def prepare_spconv_torch_inference(with_linear: bool):
    """Registers the lowering of the sparse reference modules (and, with ``with_linear``, of Linear / LinearReLU
    to the per-channel int8 linear) in torch's convert_fx; call it before convert_fx."""
    from torch.ao.quantization.fx import _lower_to_native_backend as lower
    fused = dict(SPCONV_STATIC_LOWER_FUSED_MODULE_MAP)
    plain = dict(SPCONV_STATIC_LOWER_MODULE_MAP)
    if with_linear:
        fused[nni.LinearReLU] = (nnqr.Linear, snniq.LinearPerChannelWeightReLU)
        plain[nnqr.Linear] = snnq.LinearPerChannelWeight
    lower.STATIC_LOWER_FUSED_MODULE_MAP.update(fused)
    lower.STATIC_LOWER_MODULE_MAP.update(plain)
    lower.STATIC_LOWER_FUSED_MODULE_TWO_INPUTS_MAP.update(SPCONV_STATIC_LOWER_FUSED_MODULE_TWO_INPUTS_MAP)
