"""Grouped and depthwise sparse convolution (``groups > 1``): weight layout, executors, fake kernels and autograd.

Weight and filters
  The module weight is ``[Cout, *kernel, Cin/groups]`` (spconv's KRSC layout per group, as torch.nn.ConvNd's
  ``[Cout, Cin/groups, *kernel]``): output channel ``o`` belongs to group ``o // (Cout/groups)`` and reads that
  group's ``Cin/groups`` input channels. The ops take filters ``[kvol, groups, Cin/groups, Cout/groups]``
  (``weight_to_grouped_filters``): one contiguous ``[cig, cog]`` matrix per (offset, group), the per-group
  version of the dense route's ``[kvol, Cin, Cout]``.

Route (every device; groups == 1 never comes here; chosen by ``spconv.pytorch._route.conv_grouped``)
  * kernel volume 1 without a stored map: one ``grouped_conv`` over the identity table (no kernel map);
  * CPU, and GPU with the fused route enabled: ``grouped_conv`` over the kernel map's neighbour table
    (``build_fused_map``'s ``nbr``, cached in ``maps.cache`` and shared with the fused route); its backward
    reads the reversed table, built only when a gradient is needed. Output-stationary, no atomics;
  * GPU with SPCONV_FORCE_NATIVE: ``indice_conv_grouped`` over the pairs (gather, per-group GEMM, scatter);
  * a CPU map that may repeat a row at one offset (duplicate coordinates; every map but a submanifold one)
    takes ``indice_conv_grouped`` too, which sums repeats exactly; on a GPU such maps are split into rounds
    (``pair_rounds``) as for the dense route.
"""
import functools

import torch

from spconv import _backend
from spconv.pytorch import _fused, _native
from spconv.pytorch._maps import identity_map, map_info_input, map_info_of


def check_groups(in_channels: int, out_channels: int, groups) -> int:
    """``groups`` as an int, or a ValueError naming what doesn't divide."""
    if isinstance(groups, bool) or not isinstance(groups, int) or groups < 1:
        raise ValueError(f"groups must be a positive int, got {groups!r}")
    if in_channels % groups or out_channels % groups:
        raise ValueError(f"in_channels ({in_channels}) and out_channels ({out_channels}) must both be divisible "
                         f"by groups ({groups})")
    return groups


def weight_to_grouped_filters(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """Weight ``[Cout, *kernel, Cin/groups]`` -> filters ``[kvol, groups, Cin/groups, Cout/groups]``."""
    return _native.weight_to_filters(weight, groups).contiguous()  # (a view on the GPU route)


# ---- fake kernels: shapes only, for torch.compile / torch.export / opcheck ----
@_backend.register_fake("grouped_conv")
def _grouped_conv_fake(features, filters, nbr, nbr_t, map_info=None):
    return features.new_empty((nbr.shape[0], filters.shape[1] * filters.shape[3]))


@_backend.register_fake("grouped_conv_backward")
def _grouped_conv_backward_fake(features, filters, out_grad, nbr_t, map_info=None):
    return torch.empty_like(features), torch.empty_like(filters)


@_backend.register_fake("indice_conv_grouped")
def _indice_conv_grouped_fake(features, filters, pair_in, pair_out, pair_offsets, num_out, map_info=None):
    return features.new_empty((num_out, filters.shape[1] * filters.shape[3]))


@_backend.register_fake("indice_conv_grouped_backward")
def _indice_conv_grouped_backward_fake(features, filters, out_grad, pair_in, pair_out, pair_offsets, map_info=None):
    return torch.empty_like(features), torch.empty_like(filters)


# ---- autograd: each backward calls the library its forward ran in ----
def _table_setup_context(ctx, inputs, output):
    features, filters, _nbr, nbr_t = inputs[:4]
    ctx.save_for_backward(features, filters, nbr_t)
    ctx.map_info = map_info_input(inputs, 4)  # a CPU tensor, never differentiated


def _table_backward(lib, ctx, grad):
    features, filters, nbr_t = ctx.saved_tensors
    dx, dw = lib.grouped_conv_backward(features, filters, grad.to(features.dtype).contiguous(), nbr_t, ctx.map_info)
    return dx, dw, None, None, None


def _pairs_setup_context(ctx, inputs, output):
    features, filters, pair_in, pair_out, pair_offsets = inputs[:5]
    ctx.save_for_backward(features, filters, pair_in, pair_out, pair_offsets)
    ctx.map_info = map_info_input(inputs, 6)


def _pairs_backward(lib, ctx, grad):
    features, filters, pair_in, pair_out, pair_offsets = ctx.saved_tensors
    dx, dw = lib.indice_conv_grouped_backward(features, filters, grad.to(features.dtype).contiguous(), pair_in,
                                              pair_out, pair_offsets, ctx.map_info)
    return dx, dw, None, None, None, None, None


def _register_autograd(namespace: str):
    lib = getattr(torch.ops, namespace)
    for op, backward, setup in (("grouped_conv", _table_backward, _table_setup_context),
                                ("indice_conv_grouped", _pairs_backward, _pairs_setup_context)):
        torch.library.register_autograd("%s::%s" % (namespace, op), functools.partial(backward, lib),
                                        setup_context=setup)


_backend.on_op_library(_register_autograd)


# ---- executors (the route that picks one: spconv.pytorch._route.conv_grouped) ----
def _needs_grad(features: torch.Tensor, filters: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and (features.requires_grad or filters.requires_grad)


def tables(maps, with_reverse: bool):
    """(nbr, nbr_t) of ``maps``: the fused route's neighbour tables (cached, shared with it); nbr_t is
    ``[0, kvol]`` unless ``with_reverse``."""
    nbr = _fused.fused_tables(maps, 1)[0]
    if with_reverse:
        return nbr, _fused.fused_tables(maps.reversed(), 1)[0]
    return nbr, nbr.new_empty((0, nbr.shape[1]))


def conv1x1_grouped(features: torch.Tensor, filters: torch.Tensor) -> torch.Tensor:
    """Kernel volume 1, no map: row i feeds row i (the identity table; its own reverse)."""
    rows, _, info = identity_map(features.shape[0], features.device)
    ident = rows.view(-1, 1)
    return _backend.ops.grouped_conv(features, filters, ident, ident, info)


def table_conv(features, filters, maps):
    """``grouped_conv`` over the map's neighbour table (its reverse built only when a gradient is needed)."""
    nbr, nbr_t = tables(maps, _needs_grad(features, filters))
    return _backend.ops.grouped_conv(features, filters, nbr, nbr_t, map_info_of(maps))


def pairs_conv(features, filters, maps, num_out):
    """``indice_conv_grouped`` over the pairs (sums rows repeated at one offset)."""
    return _backend.ops.indice_conv_grouped(features, filters, maps.pair_in, maps.pair_out, maps.pair_offsets,
                                            num_out, map_info_of(maps))
