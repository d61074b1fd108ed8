"""GPU pooling over the kernel map's neighbour tables: one launch forward, one backward.

``out_table`` ``[num_out, kvol]`` (the input feeding each output through each offset) drives the forward: one
thread per (output, channel) walks its offsets in ascending order, the CPU route's order, so the results are
its bits. ``in_table`` ``[num_in, kvol]`` (the output each input feeds) drives the backward the same way, per
input row. The max pool records, per (output, channel), the offset whose input takes the gradient (``argmax``,
saved for the backward instead of the input and output features).

The tables are the map builder's where it kept one (``maps.out_table`` / ``maps.in_table``: a strided or pooling
map built for a layer has both, a submanifold map its out->in table) or the fused route's where it built one; a
missing direction is made once per map (``transpose_neighbour_table``, or from the pairs for a map that has no
table at all) and cached in ``maps.cache``. Maps that repeat a row within one offset
(duplicate coordinates) have no such tables: they keep the pair ops (``spconv.pytorch.ops.pool_route``).
"""
import functools
from typing import Optional

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

from spconv import _backend
from spconv.pytorch._maps import map_info_input

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.float64)
_OUT_KEY, _IN_KEY = "pool_out_table", "pool_in_table"


# ---- fake kernels: shapes only, for torch.compile / torch.export / opcheck ----
def _argmax_fake(features, nbr, nbr_t):
    # Without a gradient the route passes nbr_t [0, kvol] (a literal 0 in a traced graph); the reversed table of a
    # map has rows unless the map has no inputs, and then no outputs either.
    kvol = nbr.shape[1]
    rows = 0 if features.dtype == torch.int8 or statically_known_true(nbr_t.shape[0] == 0) else nbr.shape[0]
    return features.new_empty((rows, features.shape[1]), dtype=torch.uint8 if kvol < 255 else torch.int32)


@_backend.register_fake("indice_maxpool_table")
def _indice_maxpool_table_fake(features, nbr, nbr_t, map_info=None):
    return features.new_empty((nbr.shape[0], features.shape[1])), _argmax_fake(features, nbr, nbr_t)


@_backend.register_fake("indice_maxpool_table_backward")
def _indice_maxpool_table_backward_fake(out_grad, argmax, nbr_t, map_info=None):
    return out_grad.new_empty((nbr_t.shape[0], out_grad.shape[1]))


@_backend.register_fake("indice_avgpool_table")
def _indice_avgpool_table_fake(features, nbr, nbr_t, map_info=None):
    return features.new_empty((nbr.shape[0], features.shape[1])), nbr.new_empty((nbr.shape[0],))


@_backend.register_fake("indice_avgpool_table_backward")
def _indice_avgpool_table_backward_fake(out_grad, count, nbr_t, map_info=None):
    return out_grad.new_empty((nbr_t.shape[0], out_grad.shape[1]))


@_backend.register_fake("transpose_neighbour_table")
def _transpose_neighbour_table_fake(table, num_rows, map_info=None):
    return table.new_empty((num_rows, table.shape[1]))


# ---- autograd ----
def _setup_context(ctx, inputs, output):
    features, _, nbr_t = inputs[:3]
    ctx.save_for_backward(output[1], nbr_t)
    ctx.num_in = features.shape[0]
    ctx.map_info = map_info_input(inputs, 3)
    ctx.mark_non_differentiable(output[1])
    ctx.set_materialize_grads(False)  # no zeros made for argmax / count: the backward is one launch


def _check_reversed(ctx, nbr_t):
    if guard_or_false(nbr_t.shape[0] != ctx.num_in):
        raise RuntimeError("the pooling forward ran without the reversed table (nbr_t with no rows: no gradient was "
                           "expected), so it has no backward")


def _maxpool_backward(lib, ctx, grad, _grad_argmax):
    if grad is None:
        return None, None, None, None
    argmax, nbr_t = ctx.saved_tensors
    _check_reversed(ctx, nbr_t)
    return lib.indice_maxpool_table_backward(grad.contiguous(), argmax, nbr_t, ctx.map_info), None, None, None


def _avgpool_backward(lib, ctx, grad, _grad_count):
    if grad is None:
        return None, None, None, None
    count, nbr_t = ctx.saved_tensors
    _check_reversed(ctx, nbr_t)
    return lib.indice_avgpool_table_backward(grad.contiguous(), count, nbr_t, ctx.map_info), None, None, None


def _register_autograd(namespace: str):
    lib = getattr(torch.ops, namespace)
    for op, backward in (("indice_maxpool_table", _maxpool_backward), ("indice_avgpool_table", _avgpool_backward)):
        torch.library.register_autograd("%s::%s" % (namespace, op), functools.partial(backward, lib),
                                        setup_context=_setup_context)


_backend.on_op_library(_register_autograd)


# ---- tables ----
def table_info(maps) -> Optional[torch.Tensor]:
    """The host record the table ops take: the map's row bounds without resolving a device-built map's pairs."""
    info = getattr(maps, "table_info", None)
    return info if info is not None else getattr(maps, "map_info", None)


def _cached_fused(maps) -> Optional[torch.Tensor]:
    """The forward table the fused route built for ``maps`` (any mask split), if it did."""
    if maps is None:
        return None
    for key, value in maps.cache.items():
        if key.startswith("fused_map_s"):
            return value[0]
    return None


def out_table(maps) -> torch.Tensor:
    """``[num_out, kvol]``: the input feeding each output through each offset (-1: none), made once per map."""
    table = maps.out_table if maps.out_table is not None else maps.cache.get(_OUT_KEY)
    if table is None:
        table = _cached_fused(maps)
    if table is None:
        rev = getattr(maps, "_reversed", None)
        other = maps.in_table if maps.in_table is not None else maps.cache.get(_IN_KEY)
        if other is None:
            other = _cached_fused(rev)
        if other is not None:
            table = _backend.ops.transpose_neighbour_table(other, maps.num_out, table_info(maps))
        else:  # a map without any table (made from pairs by hand): the fused route's builder, shared with it
            from spconv.pytorch import _fused
            table = _fused.fused_tables(maps, 1)[0]
    maps.cache[_OUT_KEY] = table
    return table


def in_table(maps) -> torch.Tensor:
    """``[num_in, kvol]``: the output each input feeds through each offset (-1: none), made once per map."""
    table = maps.in_table if maps.in_table is not None else maps.cache.get(_IN_KEY)
    if table is None:
        table = _cached_fused(getattr(maps, "_reversed", None))
    if table is None:
        table = _backend.ops.transpose_neighbour_table(out_table(maps), maps.num_in, table_info(maps))
    maps.cache[_IN_KEY] = table
    return table


# ---- route ----
def eligible(features: torch.Tensor, maps, num_out, maximum: bool) -> bool:
    """Whether the table ops take this pool: GPU code, a map of PairMaps on the features' device with the
    caller's row counts, and a dtype the kernels take (int8 for the max pool, without a gradient)."""
    if not _backend.runs_gpu_code(features.device) or not hasattr(maps, "out_table"):
        return False
    if maps.pair_offsets.device != features.device or features.dim() != 2:
        return False
    if features.dtype not in DTYPES and not (maximum and features.dtype == torch.int8):
        return False
    return not (guard_or_false(num_out != maps.num_out) or guard_or_false(features.shape[0] != maps.num_in))


def _needs_grad(features: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and features.requires_grad


def _tables(features, maps):
    nbr = out_table(maps)
    nbr_t = in_table(maps) if _needs_grad(features) else nbr.new_empty((0, nbr.shape[1]))
    return nbr, nbr_t


def maxpool(features: torch.Tensor, maps) -> torch.Tensor:
    nbr, nbr_t = _tables(features, maps)
    return _backend.ops.indice_maxpool_table(features.contiguous(), nbr, nbr_t, table_info(maps))[0]


def avgpool(features: torch.Tensor, maps):
    nbr, nbr_t = _tables(features, maps)
    return _backend.ops.indice_avgpool_table(features.contiguous(), nbr, nbr_t, table_info(maps))
