"""int8 inference of the quantized layers (``spconv.pytorch.quantization``): the op ``quantized_conv`` (CPU, and
the GPU's fused route), or on a GPU with SPCONV_FORCE_NATIVE gather -> ``torch._int_mm`` -> int32 scatter-add ->
the same epilogue in torch ops; both give the same bits.

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

This module holds the operands and the two executors (``table_conv``, ``native_conv``); which one runs is
``spconv.pytorch._route.int8_conv``'s choice.
"""
from typing import Optional

import torch

from spconv import _backend
from spconv.pytorch import _fused, pair_rounds
from spconv.pytorch._qview import as_qint8, int_view  # noqa: F401  (the int8 layers reach them here)

ACTIVATIONS = {"None_": 0, "ReLU": 1, "LeakyReLU": 2}


@_backend.register_fake("quantized_conv")
def _quantized_conv_fake(features, filters, nbr, scale, bias, residual, residual_scale, activation, alpha,
                         map_info=None):
    return features.new_empty((nbr.shape[0], filters.shape[2]))


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


def prepare(features: torch.Tensor, channel_scale: torch.Tensor, bias: Optional[torch.Tensor], output_scale: float,
            residual: Optional[torch.Tensor], activation: str):
    """The ops' operands of one int8 convolution (see ``_route.int8_conv``): (int8 features, float32 channel
    scale, float32 bias or None, int8 residual or None, residual scale, activation code)."""
    if activation not in ACTIVATIONS:
        raise ValueError(f"int8 layers support the activations {sorted(ACTIVATIONS)}, got {activation}")
    x = int_view(features).contiguous()
    dev = x.device
    scale = channel_scale.to(device=dev, dtype=torch.float32).contiguous()
    b = None if bias is None else bias.detach().to(device=dev, dtype=torch.float32).contiguous()
    res, res_scale = None, 0.0
    if residual is not None:
        res = int_view(residual).contiguous()
        res_scale = float(residual.q_scale()) / float(output_scale)
    return x, scale, b, res, res_scale, ACTIVATIONS[activation]


def table_conv(x, filters, maps, scale, bias, residual, residual_scale, activation, alpha):
    """The table kernel (``quantized_conv``, CPU and the GPU's fused route); int8 [num_out, Cout]."""
    nbr = identity_table(x.shape[0], x.device) if maps is None else neighbour_table(maps)
    return _backend.ops.quantized_conv(x, filters, nbr, scale, bias, residual, residual_scale, activation,
                                      float(alpha), _fused.table_info(maps))


# ---- the native GPU route ----
def native_conv(x, filters, maps, num_out, scale, bias, residual, residual_scale, activation, alpha):
    kvol, cin, cout = filters.shape
    if filters.dtype != torch.int8 or x.shape[1] != cin:
        raise ValueError(f"quantized_conv: filters must be int8 [kvol, {x.shape[1]}, Cout], got "
                         f"{filters.dtype} {list(filters.shape)}")
    if maps is None:
        return epilogue(int_mm(x, filters[0]), scale, bias, residual, residual_scale, activation, alpha)
    rounds = len(pair_rounds.split_rounds(maps))
    if kvol * rounds * cin >= 1 << 17:  # the table kernel's bound: |sum| < 2^31
        raise ValueError(f"quantized_conv: {kvol * rounds} products of {cin} channels per output could overflow "
                         "the int32 sum (kvol * rounds * Cin must stay below 2^17)")
    offsets = (maps.info[:kvol + 1] if maps.info is not None else maps.pair_offsets.cpu()).tolist()
    acc = torch.zeros((num_out, cout), dtype=torch.int32, device=x.device)
    for k in range(kvol):
        lo, hi = offsets[k], offsets[k + 1]
        if hi > lo:
            rows = x.index_select(0, maps.pair_in[lo:hi].long())
            acc.index_add_(0, maps.pair_out[lo:hi].long(), int_mm(rows, filters[k]))
    return epilogue(acc, scale, bias, residual, residual_scale, activation, alpha)


def int_mm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Exact int8 [m, k] @ int8 [k, n] -> int32 through the vendor GEMM (``torch._int_mm``); on a GPU it
    needs m > 16 and k, n multiples of 8, so the operands are padded with zero rows and columns there."""
    m, k = a.shape
    n = b.shape[1]
    if m == 0 or n == 0:
        return torch.zeros((m, n), dtype=torch.int32, device=a.device)
    if a.device.type == "cpu":
        return torch._int_mm(a.contiguous(), b.contiguous())
    pm, pk, pn = max(m, 17), -(-k // 8) * 8, -(-n // 8) * 8
    if (pm, pk, pn) != (m, k, n):
        a = torch.nn.functional.pad(a, (0, pk - k, 0, pm - m))
        b = torch.nn.functional.pad(b, (0, pn - n, 0, pk - k))
    return torch._int_mm(a.contiguous(), b.contiguous())[:m, :n]


def epilogue(acc: torch.Tensor, scale: torch.Tensor, bias: Optional[torch.Tensor], residual: Optional[torch.Tensor],
             residual_scale: float, activation: int, alpha: float) -> torch.Tensor:
    """``quantized_conv``'s epilogue (csrc/ops/schema.cpp) in torch ops: each one rounds on its own, in the
    kernel's order, so the int8 result is the kernel's bit for bit."""
    v = acc.to(torch.float32) * scale
    if bias is not None:
        v = v + bias
    if residual is not None:
        v = v + residual.to(torch.float32) * residual_scale
    if activation == 1:
        v = torch.where(v < 0, torch.zeros_like(v), v)
    elif activation == 2:
        v = torch.where(v < 0, v * alpha, v)
    v = torch.nan_to_num(torch.round(v), nan=0.0)  # ties to even; NaN -> 0 as the kernel's cast
    return torch.clamp(v, -128, 127).to(torch.int8)


def kernel_path(features: torch.Tensor) -> str:
    """Which int8 kernel body runs for these features' device (``quantized_conv_path``)."""
    return _backend.ops.quantized_conv_path(features if features.dtype == torch.int8 else int_view(features))
