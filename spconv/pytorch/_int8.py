"""int8 inference of the quantized layers (``spconv.pytorch.quantization``): one op, ``quantized_conv``.

The layers keep torch's quantized tensors (``torch.qint8``, per-tensor symmetric activations, per-channel
weights) as spconv 2.x does, so ``q_scale()``, ``dequantize()`` and torch's FX quantization passes work on them.
The op itself takes plain int8 tensors: ``int_view`` / ``as_qint8`` reinterpret the same memory both ways
without a copy.

The convolution is output-stationary over a neighbour table (``nbr [num_out, kvol]``: the fused route's table,
cached in the kernel map, so layers sharing an ``indice_key`` build it once). Maps that repeat a row at one offset
(duplicate coordinates) pass one block of ``kvol`` columns per round: the int32 sums must see every pair before
the epilogue rounds. The epilogue (csrc/ops/schema.cpp, int8 section): per-channel requantization
``input_scale * weight_scale / output_scale``, bias, the residual of the add variants, the activation, then
rounding to int8 (ties to even) and saturation.
"""
from typing import Optional

import torch

from spconv import _backend
from spconv.pytorch import _fused, ops, pair_rounds

ACTIVATIONS = {"None_": 0, "ReLU": 1, "LeakyReLU": 2}


@_backend.register_fake("quantized_conv")
def _quantized_conv_fake(features, filters, nbr, scale, bias, residual, residual_scale, activation, alpha,
                         map_info=None):
    return features.new_empty((nbr.shape[0], filters.shape[2]))


def int_view(q: torch.Tensor) -> torch.Tensor:
    """The int8 values of a qint8 tensor, sharing its memory."""
    if q.dtype != torch.qint8:
        raise TypeError(f"expected a torch.qint8 tensor, got {q.dtype}")
    if q.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric) and q.q_zero_point() != 0:
        raise ValueError(f"int8 layers need symmetric quantization (zero_point 0), got {q.q_zero_point()}")
    return torch.empty(0, dtype=torch.int8, device=q.device).set_(q.untyped_storage(), q.storage_offset(),
                                                                  q.shape, q.stride())


def as_qint8(t: torch.Tensor, scale: float) -> torch.Tensor:
    """A per-tensor qint8 tensor (zero point 0) over the memory of the int8 tensor ``t``."""
    q = torch._empty_affine_quantized((0,), scale=float(scale), zero_point=0, dtype=torch.qint8, device=t.device)
    return q.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())


def quantized_weight_filters(qweight: torch.Tensor) -> torch.Tensor:
    """A per-channel qint8 weight ``[Cout, *kernel, Cin]`` as the op's int8 filters ``[kvol, Cin, Cout]``."""
    w = int_view(qweight) if qweight.is_quantized else qweight
    cout, cin = w.shape[0], w.shape[-1]
    return w.reshape(cout, -1, cin).permute(1, 2, 0).contiguous()


def reinterpreted_1x1(qweight: torch.Tensor):
    """A kernel-volume-1 conv computes ``features @ weight.view(Cin, Cout)`` (spconv 2.x's reinterpretation of
    the stored ``[Cout, 1.., Cin]`` weight, not its transpose), so its per-channel scales don't fit the columns
    of that matrix: requantize it per column. Returns (filters int8 [1, Cin, Cout], float32 [Cout] scales)."""
    cout, cin = qweight.shape[0], qweight.shape[-1]
    w = qweight.dequantize().reshape(cin, cout)
    scale = (w.abs().amax(0) / 127).clamp_min(torch.finfo(torch.float32).tiny)
    q = torch.clamp(torch.round(w / scale), -127, 127).to(torch.int8)
    return q.view(1, cin, cout).contiguous(), scale.float()


def weight_scales(qweight: torch.Tensor) -> torch.Tensor:
    """float32 [Cout] scales of a quantized weight (per channel, or one per tensor)."""
    if qweight.qscheme() in (torch.per_channel_affine, torch.per_channel_symmetric):
        if qweight.q_per_channel_axis() != 0:
            raise ValueError(f"per-channel weight scales must be along axis 0 (Cout), got axis "
                             f"{qweight.q_per_channel_axis()}")
        if bool((qweight.q_per_channel_zero_points() != 0).any()):
            raise ValueError("int8 layers need symmetric weights (zero points 0)")
        return qweight.q_per_channel_scales().to(torch.float32)
    if qweight.q_zero_point() != 0:
        raise ValueError(f"int8 layers need symmetric weights (zero point 0), got {qweight.q_zero_point()}")
    return torch.full((qweight.shape[0],), qweight.q_scale(), dtype=torch.float32)


def neighbour_table(maps) -> torch.Tensor:
    """``nbr [num_out, kvol * rounds]`` of a kernel map (cached in ``maps.cache``)."""
    table = maps.cache.get("int8_table")
    if table is None:
        parts = pair_rounds.split_rounds(maps)
        tables = [_fused.fused_tables(p, 1)[0] for p in parts]
        table = tables[0] if len(tables) == 1 else torch.cat(tables, 1).contiguous()
        maps.cache["int8_table"] = table
    return table


def identity_table(n: int, device: torch.device) -> torch.Tensor:
    """The table of a 1x1 convolution: output row r reads input row r."""
    return torch.arange(n, dtype=torch.int32, device=device).view(n, 1)


def conv(features: torch.Tensor, filters: torch.Tensor, nbr: torch.Tensor, channel_scale: torch.Tensor,
         bias: Optional[torch.Tensor], output_scale: float, residual: Optional[torch.Tensor], activation: str,
         alpha: float, map_info: Optional[torch.Tensor] = None) -> torch.Tensor:
    """qint8 features [N, Cin] -> qint8 [num_out, Cout] with scale ``output_scale``.

    ``channel_scale = input_scale * weight_scales / output_scale`` and ``bias`` already divided by
    ``output_scale`` (spconv 2.x's arguments); ``residual``: a qint8 tensor added before the activation."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"int8 layers support the activations {sorted(ACTIVATIONS)}, got {activation}")
    x = int_view(features)
    dev = x.device
    scale = channel_scale.to(device=dev, dtype=torch.float32).contiguous()
    b = None if bias is None else bias.detach().to(device=dev, dtype=torch.float32).contiguous()
    res, res_scale = None, 0.0
    if residual is not None:
        res = int_view(residual).contiguous()
        res_scale = float(residual.q_scale()) / float(output_scale)
    out = _backend.ops.quantized_conv(x.contiguous(), filters, nbr, scale, b, res, res_scale,
                                      ACTIVATIONS[activation], float(alpha), map_info)
    return as_qint8(out, output_scale)


def kernel_path(features: torch.Tensor) -> str:
    """Which int8 kernel body runs for these features' device (``quantized_conv_path``)."""
    return _backend.ops.quantized_conv_path(features if features.dtype == torch.int8 else int_view(features))


def maxpool(features: torch.Tensor, maps, num_out: int) -> torch.Tensor:
    """Integer max pool of qint8 features: ``max(0, window max)`` like the float pool, the input's scale kept."""
    out = ops.indice_maxpool_native(int_view(features).contiguous(), maps, num_out)
    return as_qint8(out, features.q_scale())
