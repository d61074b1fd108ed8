"""Quantize/add functions that accept SparseConvTensors (spconv 2.x: ``quantization.core``); ``transform_qdq``
puts them in place of torch's in a converted graph."""
from typing import List, Union

import torch

from spconv.pytorch import _int8
from spconv.pytorch.core import SparseConvTensor

TensorLike = Union[SparseConvTensor, torch.Tensor]


def _quantize_one(t: TensorLike, scale, zero_point, dtype):
    if isinstance(t, SparseConvTensor):
        return t.replace_feature(torch.quantize_per_tensor(t.features, scale, zero_point, dtype))
    return torch.quantize_per_tensor(t, scale, zero_point, dtype)


def quantize_per_tensor(ten: Union[TensorLike, List[TensorLike]], scale, zero_point, dtype):
    """``torch.quantize_per_tensor`` for tensors, SparseConvTensors (their features) and lists of them."""
    if isinstance(ten, (list, tuple)):
        return [_quantize_one(v, scale[i], zero_point[i], dtype) for i, v in enumerate(ten)]
    return _quantize_one(ten, scale, zero_point, dtype)


def quantized_add(x: torch.Tensor, y: torch.Tensor, scale, zero_point) -> torch.Tensor:
    """``torch.ops.quantized.add`` for symmetric qint8 tensors on any device: the float sum of both, requantized
    to ``scale`` (round half to even, saturated)."""
    if isinstance(x, SparseConvTensor):
        return x.replace_feature(quantized_add(x.features, y.features if isinstance(y, SparseConvTensor) else y,
                                               scale, zero_point))
    if int(zero_point) != 0:
        raise ValueError(f"quantized_add: symmetric int8 needs zero_point 0, got {zero_point}")
    v = (_int8.int_view(x).float() * x.q_scale() + _int8.int_view(y).float() * y.q_scale()) / scale
    return _int8.as_qint8(torch.clamp(torch.round(v), -128, 127).to(torch.int8), scale)
