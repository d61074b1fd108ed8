"""Folding batch norms and activations into sparse convs for inference (spconv 2.x: ``quantization.utils``)."""
import copy
from typing import Any, Dict, Optional, Tuple

import torch
from torch import nn

from spconv.core import Activation


def conv_init_args(conv) -> Dict[str, Any]:
    """The constructor arguments of ``SparseConvolution`` that rebuild ``conv``'s geometry (bias excluded)."""
    return dict(ndim=conv.ndim, in_channels=conv.in_channels, out_channels=conv.out_channels,
                kernel_size=conv.kernel_size, stride=conv.stride, padding=conv.padding, dilation=conv.dilation,
                groups=conv.groups, subm=conv.subm, output_padding=conv.output_padding, transposed=conv.transposed,
                inverse=conv.inverse, indice_key=conv.indice_key, algo=conv.algo, fp32_accum=conv.fp32_accum,
                record_voxel_count=conv.record_voxel_count, act_type=conv.act_type, act_alpha=conv.act_alpha,
                act_beta=conv.act_beta)


def fuse_spconv_bn_weights(conv_w_OKI: torch.Tensor, conv_b: Optional[torch.Tensor], bn_rm: torch.Tensor,
                           bn_rv: torch.Tensor, bn_eps: float, bn_w: Optional[torch.Tensor],
                           bn_b: Optional[torch.Tensor]) -> Tuple[nn.Parameter, nn.Parameter]:
    """BN(conv(x)) as one conv: the weight ``[Cout, *k, Cin]`` scaled per output channel, the bias shifted."""
    if conv_b is None:
        conv_b = torch.zeros_like(bn_rm)
    if bn_w is None:
        bn_w = torch.ones_like(bn_rm)
    if bn_b is None:
        bn_b = torch.zeros_like(bn_rm)
    factor = bn_w * torch.rsqrt(bn_rv + bn_eps)
    w = conv_w_OKI * factor.reshape([-1] + [1] * (conv_w_OKI.dim() - 1))
    b = (conv_b - bn_rm) * factor + bn_b
    return nn.Parameter(w.contiguous()), nn.Parameter(b)


def fuse_spconv_bn_eval(conv, bn):
    """A copy of ``conv`` computing ``bn(conv(x))`` in inference mode."""
    if conv.training or bn.training:
        raise ValueError("fuse_spconv_bn_eval: conv and bn must be in eval mode")
    fused = copy.deepcopy(conv)
    fused.weight, fused.bias = fuse_spconv_bn_weights(fused.weight, fused.bias, bn.running_mean, bn.running_var,
                                                      bn.eps, bn.weight, bn.bias)
    return fused


def fuse_spconv_act_eval(conv, act):
    """A copy of ``conv`` applying ``act`` (ReLU or LeakyReLU) itself, in inference mode."""
    if conv.training:
        raise ValueError("fuse_spconv_act_eval: conv must be in eval mode")
    if isinstance(act, nn.ReLU):
        act_type, alpha = Activation.ReLU, 0.0
    elif isinstance(act, nn.LeakyReLU):
        act_type, alpha = Activation.LeakyReLU, act.negative_slope
    else:
        raise NotImplementedError(f"fuse_spconv_act_eval: only ReLU and LeakyReLU fuse, got {type(act).__name__}")
    fused = copy.deepcopy(conv)
    fused.act_type = act_type
    fused._act = act_type.name
    fused.act_alpha = alpha
    return fused
