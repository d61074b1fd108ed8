"""spconv 2.x's ``spconv.pytorch.functional``: its autograd Functions and ``sparse_add``; and the feature
computation the layers call (``conv_features``, ``conv1x1``: the route, from ``_route``)."""
from typing import List

import torch
from torch.autograd import Function
from torch.autograd.function import once_differentiable

from spconv.core import ConvAlgo
from spconv.pytorch import _native, ops
from spconv.pytorch._route import conv1x1, conv_features  # noqa: F401  (the layers' entry points)
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.hash import HashTable  # noqa: F401  (spconv 2.x exposes it here)


def weight_to_filters(weight: torch.Tensor) -> torch.Tensor:
    """spconv 2.x weight ``[Cout, *kernel, Cin]`` -> per-offset GEMM operands ``[kvol, Cin, Cout]``."""
    return _native.dense_filters(weight)


# ---- spconv 2.x autograd Functions and sparse_add ----


class SparseConvFunction(Function):
    """spconv 2.x: regular convolution over a native-layout kernel map (filters KRSC)."""

    _INVERSE, _SUBM = False, False

    @staticmethod
    def forward(ctx, features, filters, indice_pairs, indice_pair_num, num_activate_out, algo=ConvAlgo.Native,
                timer=None, bias=None, act_alpha=0.0, act_beta=0.0, act_type=None):
        cls = ctx._forward_cls
        ctx.save_for_backward(indice_pairs, indice_pair_num, features, filters)
        return ops.indice_conv(features, filters, indice_pairs, indice_pair_num, num_activate_out, cls._INVERSE,
                               cls._SUBM, algo=algo, bias=bias, act_alpha=act_alpha, act_beta=act_beta,
                               act_type=act_type)

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        cls = ctx._forward_cls
        indice_pairs, indice_pair_num, features, filters = ctx.saved_tensors
        dx, dw = ops.indice_conv_backward(features, filters, grad_output, indice_pairs, indice_pair_num,
                                          cls._INVERSE, cls._SUBM)
        return (dx, dw) + (None,) * 9


class SparseInverseConvFunction(SparseConvFunction):
    _INVERSE = True


class SubMConvFunction(SparseConvFunction):
    _SUBM = True


class SparseImplicitGemmFunction(Function):
    """spconv 2.x: convolution over an implicit-GEMM kernel map (``pair_fwd`` / ``pair_bwd``)."""

    @staticmethod
    def forward(ctx, features, filters, pair_fwd, pair_bwd, pair_mask_fwd_splits, pair_mask_bwd_splits,
                mask_argsort_fwd_splits, mask_argsort_bwd_splits, num_activate_out, masks, is_train, is_subm,
                timer=None, fp32_accum=None, bias=None, act_alpha=0.0, act_beta=0.0, act_type=None):
        out, mask_out, mask_width = ops.implicit_gemm(features, filters, pair_fwd, pair_mask_fwd_splits,
                                                      mask_argsort_fwd_splits, num_activate_out, masks, is_train,
                                                      is_subm, timer, fp32_accum, bias, act_alpha, act_beta,
                                                      act_type)
        ctx.save_for_backward(features, filters, pair_fwd, pair_bwd)
        ctx.rest = (pair_mask_fwd_splits, pair_mask_bwd_splits, mask_argsort_fwd_splits, mask_argsort_bwd_splits,
                    mask_out, masks, mask_width, is_subm)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        features, filters, pair_fwd, pair_bwd = ctx.saved_tensors
        dx, dw = ops.implicit_gemm_backward(features, filters, grad_output, pair_fwd, pair_bwd, *ctx.rest)
        return (dx, dw) + (None,) * 16


class SparseMaxPoolFunction(Function):
    """spconv 2.x: max pool over a native-layout kernel map (outputs start at 0)."""

    @staticmethod
    def forward(ctx, features, indice_pairs, indice_pair_num, num_activate_out):
        out = ops.indice_maxpool(features, indice_pairs, indice_pair_num, num_activate_out)
        ctx.save_for_backward(indice_pairs, indice_pair_num, features, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        indice_pairs, indice_pair_num, features, out = ctx.saved_tensors
        return ops.indice_maxpool_backward(features, out, grad_output, indice_pairs, indice_pair_num), None, None, None


class SparseMaxPoolImplicitGemmFunction(Function):
    @staticmethod
    def forward(ctx, features, indice_pairs_fwd, indice_pairs_bwd, num_activate_out):
        out = ops.indice_maxpool_implicit_gemm(features, indice_pairs_fwd, num_activate_out)
        ctx.save_for_backward(indice_pairs_bwd, features, out)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        indice_pairs_bwd, features, out = ctx.saved_tensors
        dx = ops.indice_maxpool_implicit_gemm_backward(features, out, grad_output, indice_pairs_bwd)
        return dx, None, None, None


class SparseAvgPoolImplicitGemmFunction(Function):
    @staticmethod
    def forward(ctx, features, indice_pairs_fwd, indice_pairs_bwd, num_activate_out, calc_count):
        out, count = ops.indice_avgpool_implicit_gemm(features, indice_pairs_fwd, num_activate_out, True)
        ctx.save_for_backward(indice_pairs_bwd, count)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_output):
        indice_pairs_bwd, count = ctx.saved_tensors
        return ops.indice_avgpool_implicit_gemm_backward(grad_output, indice_pairs_bwd, count), None, None, None, None


indice_conv = SparseConvFunction.apply
implicit_gemm = SparseImplicitGemmFunction.apply
indice_inverse_conv = SparseInverseConvFunction.apply
indice_subm_conv = SubMConvFunction.apply
indice_maxpool = SparseMaxPoolFunction.apply
indice_maxpool_implicit_gemm = SparseMaxPoolImplicitGemmFunction.apply
indice_avgpool_implicit_gemm = SparseAvgPoolImplicitGemmFunction.apply


def linear_coordinate_keys(indices: torch.Tensor, spatial_shape: List[int]) -> torch.Tensor:
    """int64 key per row: (batch, *coords) in row-major order over ``[batch, *spatial_shape]``."""
    key = indices[:, 0].long()
    for d, size in enumerate(spatial_shape):
        key = key * int(size) + indices[:, 1 + d].long()
    return key


def first_occurrence_rows(keys: torch.Tensor) -> torch.Tensor:
    """Positions of the first occurrence of every distinct key, ascending (so in first-seen order)."""
    if keys.numel() == 0:
        return keys.new_zeros((0,), dtype=torch.long)
    uniq, inverse = torch.unique(keys, return_inverse=True)
    pos = torch.arange(keys.numel(), device=keys.device)
    first = torch.full((uniq.numel(),), keys.numel(), dtype=torch.long, device=keys.device)
    first = first.scatter_reduce(0, inverse, pos, reduce="amin")
    return torch.sort(first).values


def _check_addable(tens) -> None:
    if len(tens) == 0:
        raise ValueError("sparse_add needs at least one SparseConvTensor")
    first = tens[0]
    for i, t in enumerate(tens):
        if not isinstance(t, SparseConvTensor):
            raise TypeError(f"sparse_add: argument {i} is a {type(t).__name__}, not a SparseConvTensor")
        t.check_consistent(f"sparse_add argument {i}")
        if t.spatial_shape != first.spatial_shape or t.batch_size != first.batch_size:
            raise ValueError(f"sparse_add: argument {i} has spatial_shape {t.spatial_shape} and batch_size "
                             f"{t.batch_size}, argument 0 has {first.spatial_shape} and {first.batch_size}")
        if t.features.shape[1] != first.features.shape[1]:
            raise ValueError(f"sparse_add: argument {i} has {t.features.shape[1]} channels, argument 0 has "
                             f"{first.features.shape[1]}")
        if t.features.device != first.features.device:
            raise ValueError(f"sparse_add: argument {i} is on {t.features.device}, argument 0 on "
                             f"{first.features.device}")


def _sum_rows_in_order(feats: torch.Tensor, out_row: torch.Tensor, num_rows: int) -> torch.Tensor:
    """``zeros.index_add(0, out_row, feats)`` with the additions in row order on every device.

    CUDA's index_add adds colliding rows with atomics (the order, and so the bits, vary run to run). Here the
    rows are added in rounds: round r adds every output's r-th contributor (in stacked-row order), so no
    round has two rows for one output. Rounds = the largest number of contributors of one output.
    """
    out = feats.new_zeros((num_rows, feats.shape[1]))
    if out_row.numel() == 0:
        return out
    sorted_rows, perm = torch.sort(out_row, stable=True)
    _, counts = torch.unique_consecutive(sorted_rows, return_counts=True)
    starts = torch.cumsum(counts, 0) - counts
    rank = torch.arange(out_row.numel(), device=out_row.device) - torch.repeat_interleave(starts, counts)
    for r in range(int(counts.max())):
        pick = perm[rank == r]
        out = out.index_add(0, out_row[pick], feats[pick])
    return out


def sparse_add(*tens: SparseConvTensor) -> SparseConvTensor:
    """Sum of tensors on different coordinate sets of the same grid; gradients flow to every operand.

    Output rows: the largest operand's rows in its order, then coordinates only the others have, in first-seen
    order. So when the union is exactly the largest operand's coordinates, the result has that operand's
    coordinates in the same order and keeps its ``indice_dict`` (its kernel maps stay valid); otherwise the
    result has no kernel maps, and a later SparseInverseConv can't undo an earlier layer through it. (spconv
    2.3.8 keeps the maps when the counts match even though it reorders the rows, which breaks them.)
    """
    _check_addable(tens)
    if torch.compiler.is_compiling():
        # Which operand is largest (it sets the row order and whether kernel maps survive) depends on the data.
        raise NotImplementedError("sparse_add / AddTableMisaligned can't be traced (torch.export, torch.compile): "
                                  "its output row order and kernel maps depend on which operand has the most rows")
    sizes = [t.features.shape[0] for t in tens]
    big = max(range(len(tens)), key=lambda i: sizes[i])
    order = [big] + [i for i in range(len(tens)) if i != big]
    first = tens[0]
    device = first.features.device
    keys = torch.cat([linear_coordinate_keys(tens[i].indices.to(device), first.spatial_shape) for i in order])
    rows = first_occurrence_rows(keys)
    # Output row of every stacked input row: rank of its key among the first occurrences.
    uniq_sorted, inverse = torch.unique(keys, return_inverse=True)
    rank_of_uniq = torch.empty((uniq_sorted.numel(),), dtype=torch.long, device=device)
    rank_of_uniq[inverse[rows]] = torch.arange(rows.numel(), device=device)
    out_row = rank_of_uniq[inverse]
    feats = torch.cat([tens[i].features for i in order])
    out_features = _sum_rows_in_order(feats, out_row, rows.numel())
    out_indices = torch.cat([tens[i].indices.to(device) for i in order])[rows].contiguous()
    keep = rows.numel() == sizes[big]
    res = tens[big].with_structure(out_features, out_indices, first.spatial_shape,
                                   tens[big].indice_dict if keep else {})
    res.benchmark = first.benchmark
    res.benchmark_record = first.benchmark_record
    res._timer = first._timer
    res.thrust_allocator = first.thrust_allocator
    return res


def sparse_add_hash_based(*tens: SparseConvTensor) -> SparseConvTensor:
    """spconv 2.x's hash-table variant of ``sparse_add``: same result, same row order, here."""
    return sparse_add(*tens)
