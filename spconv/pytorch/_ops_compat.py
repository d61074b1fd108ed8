"""spconv 2.x's ``spconv.pytorch.ops`` functions with their signatures and return layouts, over our ops.

Code written against spconv 2.x (custom layers, export scripts) calls these directly; ``ops.py`` re-exports
them. Each runs the native op wrappers (``_native``) on the native route (``_route``'s rounds and pool routes).
Kernel maps come in spconv's two layouts:

* native: ``indice_pairs`` int32 ``[2, kvol, num_in]`` (row 0 inputs, row 1 outputs, the first
  ``indice_pair_num[k]`` entries of offset ``k`` valid) and ``indice_pair_num`` int32 ``[kvol]``;
* implicit GEMM: ``pair_fwd`` int32 ``[kvol, num_out]`` (input row per offset and output, -1 if none) and
  ``pair_bwd`` int32 ``[kvol, num_in]`` (output row per offset and input), plus per-row offset bit masks.

Every function computes on the native route whatever layout it gets; the masks, argsorts, ``algo``, ``timer`` and
``alloc`` arguments are accepted for compatibility and don't change results. Weights are spconv 2.x's KRSC
``[Cout, *kernel, Cin]``. As in spconv, ``bias`` and ``act_type`` are applied in the forward functions but no
gradient flows through them there (spconv's modules fuse them only at inference).
"""
from typing import List, Optional, Tuple

import numpy as np
import torch

from spconv import _backend
from spconv.core import ConvAlgo
from spconv.pytorch import _native, _route
from spconv.pytorch._activation import _activation_name, apply_activation
from spconv.pytorch._maps import PairMaps, pairs_to_spconv_layout
from spconv.pytorch._symsize import as_size

_ops = _backend.ops  # the selected op library (torch.ops.spconv unless a test swaps it)


# ---- layout conversions ----

def _offsets_from_counts(counts: torch.Tensor) -> torch.Tensor:
    counts = counts.to(torch.int64)
    return torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])


def _maps_from_native(indice_pairs: torch.Tensor, indice_pair_num: torch.Tensor, num_in: int, num_out: int,
                      inverse: bool = False) -> PairMaps:
    if indice_pairs.dim() != 3 or indice_pairs.shape[0] != 2:
        raise ValueError(f"indice_pairs must be [2, kvol, N] (spconv's native layout), got "
                         f"{tuple(indice_pairs.shape)}")
    counts = indice_pair_num.to(device=indice_pairs.device, dtype=torch.int64).reshape(-1)
    if counts.numel() != indice_pairs.shape[1]:
        raise ValueError(f"indice_pair_num has {counts.numel()} entries but indice_pairs has "
                         f"{indice_pairs.shape[1]} kernel offsets")
    if counts.numel() and (int(counts.min()) < 0 or int(counts.max()) > indice_pairs.shape[2]):
        raise ValueError(f"indice_pair_num entries must be in [0, {indice_pairs.shape[2]}]")
    valid = torch.arange(indice_pairs.shape[2], device=counts.device)[None, :] < counts[:, None]
    src, dst = indice_pairs[int(inverse)], indice_pairs[int(not inverse)]
    pin, pout = src[valid].int().contiguous(), dst[valid].int().contiguous()
    return PairMaps(pin, pout, _offsets_from_counts(counts), num_in, num_out)


def _maps_from_table(table: torch.Tensor, rows_are_outputs: bool, num_in: int, num_out: int) -> PairMaps:
    """``table[k, r]``: partner of row r through offset k, or -1 (pair_fwd: rows are outputs)."""
    if table.dim() != 2:
        raise ValueError(f"the pair table must be [kvol, N], got {tuple(table.shape)}")
    valid = table >= 0
    k, r = valid.nonzero(as_tuple=True)  # row-major: grouped by offset, rows ascending
    partner = table[k, r].int()
    rows = r.int()
    counts = valid.sum(1)
    pin, pout = (partner, rows) if rows_are_outputs else (rows, partner)
    return PairMaps(pin.contiguous(), pout.contiguous(), _offsets_from_counts(counts), num_in, num_out)


def _table_from_maps(maps: PairMaps, rows_are_outputs: bool) -> torch.Tensor:
    kvol = maps.kernel_volume
    width = maps.num_out if rows_are_outputs else maps.num_in
    table = torch.full((kvol, width), -1, dtype=torch.int32, device=maps.pair_in.device)
    if maps.pair_in.numel():
        k = torch.repeat_interleave(torch.arange(kvol, device=maps.pair_in.device), maps.pair_counts())
        rows, partner = (maps.pair_out, maps.pair_in) if rows_are_outputs else (maps.pair_in, maps.pair_out)
        table[k, rows.long()] = partner
    return table


def _conv(features: torch.Tensor, filters: torch.Tensor, maps: PairMaps, num_out: int) -> torch.Tensor:
    """The native op over ``maps``, by rounds where the GPU code runs (see ``_route.on_device_rounds``)."""
    return _route.on_device_rounds(lambda p: _ops.indice_conv(features, filters, p.pair_in, p.pair_out,
                                                              p.pair_offsets, num_out, p.map_info),
                                   maps, features.device)


def _conv_backward(features: torch.Tensor, filters: torch.Tensor, out_bp: torch.Tensor,
                   maps: PairMaps) -> Tuple[torch.Tensor, torch.Tensor]:
    return _route.on_device_rounds(lambda p: tuple(_ops.indice_conv_backward(features, filters, out_bp, p.pair_in,
                                                                             p.pair_out, p.pair_offsets,
                                                                             p.map_info)),
                                   maps, features.device)


def _krsc_to_filters(filters: torch.Tensor) -> torch.Tensor:
    cout, cin = filters.shape[0], filters.shape[-1]
    return filters.reshape(cout, -1, cin).permute(1, 2, 0).contiguous()


def _filters_grad_to_krsc(dw: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    return dw.permute(2, 0, 1).reshape(filters.shape).contiguous()


def _bias_act(out: torch.Tensor, bias, act_type, act_alpha: float) -> torch.Tensor:
    if bias is not None:
        out = out + bias
    if act_type is None:
        return out
    return apply_activation(out, _activation_name(act_type), act_alpha)


def _mask_words(table: torch.Tensor) -> torch.Tensor:
    """Per row, the offsets it has a partner through, as int32 words of 32 bits ``[N, ceil(kvol / 32)]``."""
    kvol, n = table.shape
    words = max(1, (kvol + 31) // 32)
    valid = (table >= 0).to(torch.int64)
    out = torch.zeros((n, words), dtype=torch.int64, device=table.device)
    for k in range(kvol):
        out[:, k // 32] |= valid[k] << (k % 32)
    return ((out + 2 ** 31) % 2 ** 32 - 2 ** 31).to(torch.int32)  # uint32 bits held in int32, as spconv


def _split_masks(kvol: int, algo: ConvAlgo) -> List[np.ndarray]:
    if algo == ConvAlgo.MaskSplitImplicitGemm and kvol <= 32:
        half = kvol // 2
        remain = kvol - half
        first = (1 << remain) - 1
        return [np.array([first], dtype=np.uint32), np.array([((1 << half) - 1) << remain], dtype=np.uint32)]
    return [np.array([0xffffffff], dtype=np.uint32)]


def _mask_splits(table: torch.Tensor, masks: List[np.ndarray]) -> Tuple[List[torch.Tensor], List[torch.Tensor]]:
    words = _mask_words(table)
    splits, argsorts = [], []
    for m in masks:
        bits = int(m.reshape(-1)[0])
        signed = bits - 2 ** 32 if bits >= 2 ** 31 else bits
        split = words.clone()
        split[:, 0] &= signed
        splits.append(split)
        key = split[:, 0].to(torch.int64) & 0xffffffff
        argsorts.append(torch.argsort(key, descending=True, stable=True).int())
    return splits, argsorts


# ---- kernel maps ----

def _out_shape(spatial_shape, ksize, stride, padding, dilation, out_padding, subm, transpose) -> List[int]:
    if subm:
        return list(spatial_shape)
    if transpose:
        return _native.get_deconv_output_size(spatial_shape, ksize, stride, padding, dilation, out_padding)
    return _native.get_conv_output_size(spatial_shape, ksize, stride, padding, dilation)


def _build(indices, batch_size, spatial_shape, ksize, stride, padding, dilation, out_padding, subm, transpose):
    ndim = indices.shape[1] - 1
    ksize, stride, padding, dilation = (list(v) if isinstance(v, (list, tuple)) else [int(v)] * ndim
                                        for v in (ksize, stride, padding, dilation))
    out_padding = list(out_padding) if isinstance(out_padding, (list, tuple)) else [int(out_padding)] * ndim
    out_shape = _out_shape(list(spatial_shape), ksize, stride, padding, dilation, out_padding, subm, transpose)
    return _native.build_kernel_map(indices, batch_size, list(spatial_shape), out_shape, ksize, stride, padding,
                                    dilation, subm, transpose)


def get_indice_pairs(indices: torch.Tensor, batch_size: int, spatial_shape: List[int], algo: ConvAlgo,
                     ksize: List[int], stride: List[int], padding: List[int], dilation: List[int],
                     out_padding: List[int], subm: bool = False, transpose: bool = False,
                     num_out_act_bound: int = -1):
    """spconv 2.x: ``(out_indices, indice_pairs [2, kvol, num_in], indice_pair_num [kvol])``, all int32."""
    outids, maps = _build(indices, batch_size, spatial_shape, ksize, stride, padding, dilation, out_padding, subm,
                          transpose)
    return outids, pairs_to_spconv_layout(maps, maps.num_in), maps.pair_counts().int()


def get_indice_pairs_implicit_gemm(indices: torch.Tensor, batch_size: int, spatial_shape: List[int],
                                   algo: ConvAlgo, ksize: List[int], stride: List[int], padding: List[int],
                                   dilation: List[int], out_padding: List[int], subm: bool = False,
                                   transpose: bool = False, is_train: bool = True, alloc=None, timer=None,
                                   num_out_act_bound: int = -1, direct_table: bool = False, do_sort: bool = True):
    """spconv 2.x: ``(out_inds, indice_num_per_loc, pair_fwd, pair_bwd, pair_mask_fwd_splits,
    pair_mask_bwd_splits, mask_argsort_fwd_splits, mask_argsort_bwd_splits, masks)``.

    ``pair_bwd`` and the backward splits are empty when ``is_train`` is False; for ``subm`` the backward splits
    are empty lists (spconv reuses the forward ones).
    """
    outids, maps = _build(indices, batch_size, spatial_shape, ksize, stride, padding, dilation, out_padding, subm,
                          transpose)
    masks = _split_masks(maps.kernel_volume, algo)
    pair_fwd = _table_from_maps(maps, rows_are_outputs=True)
    fwd_splits, fwd_argsorts = _mask_splits(pair_fwd, masks)
    pair_bwd, bwd_splits, bwd_argsorts = torch.Tensor(), [], []
    if is_train:
        pair_bwd = _table_from_maps(maps, rows_are_outputs=False)
        if not subm:
            bwd_splits, bwd_argsorts = _mask_splits(pair_bwd, masks)
    return (outids, maps.pair_counts().int(), pair_fwd, pair_bwd, fwd_splits, bwd_splits, fwd_argsorts,
            bwd_argsorts, masks)


# ---- convolution ----

def indice_conv(features: torch.Tensor, filters: torch.Tensor, indice_pairs: torch.Tensor,
                indice_pair_num: torch.Tensor, num_activate_out: int, inverse: bool = False, subm: bool = False,
                algo: ConvAlgo = ConvAlgo.Native, timer=None, bias: Optional[torch.Tensor] = None,
                act_alpha: float = 0.0, act_beta: float = 0.0, act_type=None) -> torch.Tensor:
    """``out[o] += features[i] @ W_k`` over the pairs (rows swapped when ``inverse``); filters KRSC."""
    maps = _maps_from_native(indice_pairs, indice_pair_num, features.shape[0], int(num_activate_out), inverse)
    out = _conv(features.contiguous(), _krsc_to_filters(filters), maps, int(num_activate_out))
    return _bias_act(out, bias, act_type, act_alpha)


def indice_conv_backward(features: torch.Tensor, filters: torch.Tensor, out_bp: torch.Tensor,
                         indice_pairs: torch.Tensor, indice_pair_num: torch.Tensor, inverse: bool = False,
                         subm: bool = False, algo: ConvAlgo = ConvAlgo.Native,
                         timer=None) -> Tuple[torch.Tensor, torch.Tensor]:
    """spconv 2.x: ``(d features, d filters)`` with d filters in the filters' KRSC shape."""
    maps = _maps_from_native(indice_pairs, indice_pair_num, features.shape[0], out_bp.shape[0], inverse)
    dx, dw = _conv_backward(features.contiguous(), _krsc_to_filters(filters), out_bp.contiguous(), maps)
    return dx, _filters_grad_to_krsc(dw, filters)


def implicit_gemm(features: torch.Tensor, filters: torch.Tensor, pair_fwd: torch.Tensor,
                  pair_mask_fwd_splits: List[torch.Tensor], mask_argsort_fwd_splits: List[torch.Tensor],
                  num_activate_out: int, masks: List[np.ndarray], is_train: bool, is_subm: bool, timer=None,
                  fp32_accum: Optional[bool] = None, bias: Optional[torch.Tensor] = None, act_alpha: float = 0.0,
                  act_beta: float = 0.0, act_type=None, output_scale: float = 1.0,
                  scale: Optional[torch.Tensor] = None, output_add: Optional[torch.Tensor] = None,
                  output_add_scale: float = 0.0, output_dtype: Optional[torch.dtype] = None):
    """spconv 2.x: ``(out_features, mask_output_fwd, mask_width)``; ``mask_output_fwd`` is None unless
    ``is_train`` (spconv's backward refuses to run without it)."""
    if features.is_quantized or scale is not None or output_add is not None:
        raise NotImplementedError("int8 implicit GEMM (scale / output_add) is not supported")
    maps = _maps_from_table(pair_fwd, True, features.shape[0], int(num_activate_out))
    out = _conv(features.contiguous(), _krsc_to_filters(filters), maps, int(num_activate_out))
    out = _bias_act(out, bias, act_type, act_alpha)
    if output_dtype is not None:
        out = out.to(output_dtype)
    mask_out = torch.stack(list(pair_mask_fwd_splits)) if is_train and len(pair_mask_fwd_splits) else None
    if is_train and mask_out is None:
        mask_out = _mask_words(pair_fwd)[None]
    return out, mask_out, 32


def implicit_gemm_backward(features: torch.Tensor, filters: torch.Tensor, out_bp: torch.Tensor,
                           pair_fwd: torch.Tensor, pair_bwd: torch.Tensor, pair_mask_fwd_splits: List[torch.Tensor],
                           pair_mask_bwd_splits: List[torch.Tensor], mask_argsort_fwd_splits: List[torch.Tensor],
                           mask_argsort_bwd_splits: List[torch.Tensor], mask_output_fwd: Optional[torch.Tensor],
                           masks: List[np.ndarray], mask_width: int, is_subm: bool, timer=None,
                           fp32_accum: Optional[bool] = None) -> Tuple[torch.Tensor, torch.Tensor]:
    if mask_output_fwd is None:
        raise ValueError("mask_output_fwd is None: run the forward with is_train=True (net.train()) to backprop")
    maps = _maps_from_table(pair_fwd, True, features.shape[0], out_bp.shape[0])
    dx, dw = _conv_backward(features.contiguous(), _krsc_to_filters(filters), out_bp.contiguous(), maps)
    return dx, _filters_grad_to_krsc(dw, filters)


# ---- pooling ----

def indice_maxpool(features: torch.Tensor, indice_pairs: torch.Tensor, indice_pair_num: torch.Tensor,
                   num_activate_out: int) -> torch.Tensor:
    maps = _maps_from_native(indice_pairs, indice_pair_num, features.shape[0], int(num_activate_out))
    return _route.indice_maxpool_native(features.contiguous(), maps, int(num_activate_out))


def indice_maxpool_backward(features: torch.Tensor, out_features: torch.Tensor, out_bp: torch.Tensor,
                            indice_pairs: torch.Tensor, indice_pair_num: torch.Tensor) -> torch.Tensor:
    maps = _maps_from_native(indice_pairs, indice_pair_num, features.shape[0], out_features.shape[0])
    lib, m = _route.pool_route(features, maps)
    dev = m.pair_in.device
    return lib.indice_maxpool_backward(features.contiguous().to(dev), out_features.contiguous().to(dev),
                                        out_bp.contiguous().to(dev), m.pair_in, m.pair_out,
                                        m.pair_offsets).to(features.device)


def indice_maxpool_implicit_gemm(features: torch.Tensor, indice_pairs: torch.Tensor,
                                 num_activate_out: int) -> torch.Tensor:
    """``indice_pairs`` is ``pair_fwd`` ``[kvol, num_out]``."""
    maps = _maps_from_table(indice_pairs, True, features.shape[0], int(num_activate_out))
    return _route.indice_maxpool_native(features.contiguous(), maps, int(num_activate_out))


def indice_maxpool_implicit_gemm_backward(features: torch.Tensor, out_features: torch.Tensor, out_bp: torch.Tensor,
                                          indice_pairs: torch.Tensor) -> torch.Tensor:
    """``indice_pairs`` is ``pair_bwd`` ``[kvol, num_in]``."""
    maps = _maps_from_table(indice_pairs, False, features.shape[0], out_features.shape[0])
    lib, m = _route.pool_route(features, maps)
    dev = m.pair_in.device
    return lib.indice_maxpool_backward(features.contiguous().to(dev), out_features.contiguous().to(dev),
                                        out_bp.contiguous().to(dev), m.pair_in, m.pair_out,
                                        m.pair_offsets).to(features.device)


def indice_avgpool_implicit_gemm(features: torch.Tensor, indice_pairs: torch.Tensor, num_activate_out: int,
                                 calc_count: bool) -> Tuple[torch.Tensor, torch.Tensor]:
    """spconv 2.x: ``(out, count)``; count (int32 ``[num_out]``) is an empty tensor unless ``calc_count``."""
    maps = _maps_from_table(indice_pairs, True, features.shape[0], int(num_activate_out))
    out, count = _route.indice_avgpool_native(features.contiguous(), maps, int(num_activate_out))
    return out, (count if calc_count else torch.Tensor())


def indice_avgpool_implicit_gemm_backward(out_bp: torch.Tensor, indice_pairs: torch.Tensor,
                                          count_out: torch.Tensor) -> torch.Tensor:
    """``indice_pairs`` is ``pair_bwd`` ``[kvol, num_in]``; ``count_out`` from the forward with calc_count."""
    maps = _maps_from_table(indice_pairs, False, indice_pairs.shape[1], out_bp.shape[0])
    lib, m = _route.pool_route(out_bp, maps)
    dev = m.pair_in.device
    return lib.indice_avgpool_backward(out_bp.contiguous().to(dev), count_out.int().contiguous().to(dev), m.pair_in,
                                        m.pair_out, m.pair_offsets, indice_pairs.shape[1]).to(out_bp.device)


def global_pool_rearrange(out_indices: torch.Tensor, batch_size: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Rows grouped by batch: ``(rows [batch_size, max_count] int32, -1 padded; counts [batch_size] int32)``."""
    batch = out_indices[:, 0].long()
    counts = torch.bincount(batch, minlength=batch_size)
    order = torch.argsort(batch, stable=True)
    width = int(counts.max()) if counts.numel() and out_indices.shape[0] else 0
    rows = torch.full((batch_size, width), -1, dtype=torch.int32, device=out_indices.device)
    if out_indices.shape[0]:
        starts = torch.cumsum(counts, 0) - counts
        col = torch.arange(order.numel(), device=order.device) - starts[batch[order]]
        rows[batch[order], col] = order.int()
    return rows, counts.int()


def maximum_value_int_(ten: torch.Tensor, value: int) -> torch.Tensor:
    """In place: ``ten = max(ten, value)`` (spconv's voxel-count recorder)."""
    return ten.clamp_(min=as_size(value))  # a SymInt while tracing
