"""The native route's op wrappers: kernel-map building, the gather-GEMM-scatter convolution, the weight layout
and pooling over ``torch.ops.spconv.*`` (called through ``_backend.ops``), with their fake kernels (torch.compile /
torch.export) and autograd formulas. No route policy here (that is ``_route``); spconv 2.x's ``ops`` re-exports
these."""
import functools
from typing import List, Tuple

import torch

from spconv import _backend  # loads the extension; _backend.ops is the op library the wrappers call
from spconv.pytorch._maps import PairMaps, map_info_input

_ops = _backend.ops  # the selected op library (torch.ops.spconv unless a test swaps it)


def get_conv_output_size(input_size: List[int], kernel_size: List[int], stride: List[int], padding: List[int],
                         dilation: List[int]) -> List[int]:
    """Regular convolution: ``(in + 2p - d(k-1) - 1) // s + 1`` per dimension."""
    size = [(i + 2 * p - d * (k - 1) - 1) // s + 1
            for i, k, s, p, d in zip(input_size, kernel_size, stride, padding, dilation)]
    if any(v <= 0 for v in size):
        raise ValueError(f"spatial_shape {list(input_size)} is too small for kernel_size {list(kernel_size)}, "
                         f"stride {list(stride)}, padding {list(padding)}, dilation {list(dilation)}: "
                         f"output shape would be {size}")
    return size


def get_deconv_output_size(input_size: List[int], kernel_size: List[int], stride: List[int], padding: List[int],
                           dilation: List[int], output_padding: List[int]) -> List[int]:
    """Transposed convolution, spconv 2.x's formula: ``(in - 1) s - 2p + k + output_padding``.

    Like spconv it ignores dilation (``torch.nn.ConvTranspose`` adds ``(d - 1)(k - 1)``): outputs a dilated
    kernel would place beyond this shape are dropped.
    """
    size = [(i - 1) * s - 2 * p + k + op
            for i, k, s, p, op in zip(input_size, kernel_size, stride, padding, output_padding)]
    if any(v <= 0 for v in size):
        raise ValueError(f"transposed convolution output shape would be {size}")
    return size


def build_kernel_map(indices: torch.Tensor, batch_size: int, spatial_shape: List[int], out_shape: List[int],
                     ksize: List[int], stride: List[int], padding: List[int], dilation: List[int], subm: bool,
                     transpose: bool) -> Tuple[torch.Tensor, PairMaps]:
    """Output indices and the per-offset (input, output) pairs of one layer."""
    if not torch.compiler.is_compiling() and subm and all(v == 1 for v in stride) and \
            _backend.runs_gpu_code(indices.device):
        return indices, _subm_map_on_device(indices, batch_size, spatial_shape, ksize, dilation)
    args = (indices, batch_size, list(spatial_shape), list(out_shape), list(ksize), list(stride), list(padding),
            list(dilation))
    tables = {}
    if not subm and not torch.compiler.is_compiling() and _backend.runs_gpu_code(indices.device):
        # Both tables from the builder: out->in for the fused forward and the pools, in->out for dinput, the
        # inverse conv and the pools' backward (no table where the indices repeat a coordinate).
        out_indices, pair_in, pair_out, pair_offsets, info, table, out_table = _ops.strided_kernel_map(*args,
                                                                                                    transpose)
        tables = {"in_table": table}
        if out_table.shape[0] == out_indices.shape[0]:
            tables["out_table"] = out_table
    else:
        out_indices, pair_in, pair_out, pair_offsets, info, table = _ops.get_indice_pairs(*args, subm, transpose)
        # The builder's table is the fused route's (forward for subm, reversed otherwise), where that route runs.
        if _backend.runs_gpu_code(indices.device):
            tables = {"out_table": table} if subm else {"in_table": table}
    # Submanifold maps never repeat a row at one offset: the builder rejects duplicate coordinates.
    return out_indices, PairMaps(pair_in, pair_out, pair_offsets, indices.shape[0], out_indices.shape[0],
                                 repeat_free=subm, info=info, **tables)


def _subm_map_on_device(indices: torch.Tensor, batch_size: int, spatial_shape: List[int], ksize: List[int],
                        dilation: List[int]) -> PairMaps:
    """A submanifold map built on the GPU without a host read: the out->in table (with the fused route's masks
    and order, when that route runs) now, the pairs and the host record (and the checks of the indices, made on
    the device) at the first use that needs them (the native route, the backward), through one host read."""
    from spconv.pytorch import _fused

    kvol = 1
    for k in ksize:
        kvol *= k
    splits = _fused.split_count(kvol) if _backend.fused_route_enabled(indices.device) else 0
    args = (indices, batch_size, list(spatial_shape), list(ksize), list(dilation))
    nbr, masks, order, pair_offsets, status = _ops.subm_kernel_map(*args, splits)
    n = indices.shape[0]
    maps = PairMaps(None, None, pair_offsets, n, n, repeat_free=True, out_table=nbr,
                    pending=lambda: _ops.subm_map_pairs(*args, nbr, pair_offsets, status))
    if splits:
        maps.cache[_fused.table_cache_key(splits)] = (nbr, masks, order)
    _fused.mark_mirrored(maps, ksize)
    return maps


@_backend.register_fake("get_indice_pairs")
def _get_indice_pairs_fake(indices, batch_size, spatial_shape, out_shape, ksize, stride, padding, dilation, subm,
                           transpose):
    ctx = torch.library.get_ctx()
    kvol = 1
    for k in ksize:
        kvol *= k
    num_in = indices.shape[0]
    # Every input reaches at most kvol outputs, through at most kvol pairs: the bounds that let the
    # graph's later size arithmetic (and the inverse conv's checks) resolve without guards.
    num_out = num_in if subm else ctx.new_dynamic_size()
    num_pairs = ctx.new_dynamic_size()
    if not subm:
        torch._check(num_out <= num_in * kvol)
    torch._check(num_pairs <= num_in * kvol)
    out_indices = indices.new_empty((num_out, indices.shape[1]))
    return (out_indices, indices.new_empty((num_pairs,)), indices.new_empty((num_pairs,)),
            indices.new_empty((kvol + 1,), dtype=torch.int64), torch.empty((kvol + 4,), dtype=torch.int64),
            indices.new_empty((num_in, kvol)))


@_backend.register_fake("indice_conv")
def _indice_conv_fake(features, filters, pair_in, pair_out, pair_offsets, num_out, map_info=None,
                      out_positions=None, in_positions=None):
    return features.new_empty((num_out, filters.shape[2]))


@_backend.register_fake("indice_conv_backward")
def _indice_conv_backward_fake(features, filters, out_grad, pair_in, pair_out, pair_offsets, map_info=None,
                               in_positions=None):
    return torch.empty_like(features), torch.empty_like(filters)


@_backend.register_fake("pair_positions")
def _pair_positions_fake(pair_dst, pair_offsets, num_dst):
    return pair_dst.new_empty((num_dst, pair_offsets.shape[0] - 1))


def _indice_conv_setup_context(ctx, inputs, output):
    features, filters, pair_in, pair_out, pair_offsets = inputs[:5]
    ctx.save_for_backward(features, filters, pair_in, pair_out, pair_offsets)
    ctx.map_info = map_info_input(inputs, 6)  # a CPU tensor, never differentiated
    ctx.in_positions = map_info_input(inputs, 8)  # the map's table by input row (GPU route), never modified


def _indice_conv_backward(lib, ctx, grad):
    features, filters, pair_in, pair_out, pair_offsets = ctx.saved_tensors
    dx, dw = lib.indice_conv_backward(features, filters, grad.contiguous(), pair_in, pair_out, pair_offsets,
                                      ctx.map_info, ctx.in_positions)
    return dx, dw, None, None, None, None, None, None, None


def needs_autograd(*tensors: torch.Tensor) -> bool:
    """Whether an op call on ``tensors`` goes through its autograd formula: a gradient is wanted, or a traced graph
    (torch.compile, torch.export) records the op. Otherwise the call may skip the formula's Python wrapper, which
    costs a small layer more host time than the op itself (``below_autograd``)."""
    if torch.compiler.is_compiling():
        return True
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if t.requires_grad:
            return True
    return False


below_autograd = torch._C._AutoDispatchBelowAutograd  # the op's own kernel, as the wrapper calls it without grad


def _positions(maps: PairMaps, side: str) -> torch.Tensor:
    """The map's pair_positions table by output (``side="out"``) or input row, made on first use and kept with
    the map: the GPU route's row sums read it, and it depends on the map alone."""
    key = "native_positions_" + side
    table = maps.cache.get(key)
    if table is None:
        dst, rows = (maps.pair_out, maps.num_out) if side == "out" else (maps.pair_in, maps.num_in)
        table = maps.cache[key] = _ops.pair_positions(dst, maps.pair_offsets, rows)
    return table


def indice_conv_native(features: torch.Tensor, filters: torch.Tensor, maps: PairMaps,
                       num_out: int) -> torch.Tensor:
    """Native route: ``out[pair_out] += features[pair_in] @ filters[k]``; filters ``[kvol, Cin, Cout]``. On the GPU
    route the map's position tables come from the map (made once) instead of each call."""
    grad = needs_autograd(features, filters)
    out_pos = in_pos = None
    if _backend.runs_gpu_code(features.device) and not torch.compiler.is_compiling():
        out_pos = _positions(maps, "out")
        in_pos = _positions(maps, "in") if grad else None
    args = (features, filters, maps.pair_in, maps.pair_out, maps.pair_offsets, num_out, maps.map_info, out_pos,
            in_pos)
    if grad:
        return _ops.indice_conv(*args)
    with below_autograd():
        return _ops.indice_conv(*args)


# ---- weight layout: weight [Cout, *kernel, Cin/groups] <-> filters [kvol, groups, Cin/groups, Cout/groups] ----

@_backend.register_fake("weight_to_filters")
def _weight_to_filters_fake(weight, groups):
    kvol = 1
    for k in weight.shape[1:-1]:
        kvol *= k
    return weight.new_empty((kvol, groups, weight.shape[-1], weight.shape[0] // groups))


@_backend.register_fake("filters_to_weight")
def _filters_to_weight_fake(filters, kernel_size):
    groups, cig, cog = filters.shape[1:]
    return filters.new_empty((groups * cog, *kernel_size, cig))


def _weight_to_filters_setup_context(ctx, inputs, output):
    ctx.kernel_size = list(inputs[0].shape[1:-1])


def _filters_to_weight_setup_context(ctx, inputs, output):
    ctx.groups = inputs[0].shape[1]


# Each op's gradient is the other op (the two layouts hold the same elements).
torch.library.register_autograd(
    "spconv::weight_to_filters",
    lambda ctx, grad: (torch.ops.spconv.filters_to_weight(grad.contiguous(), ctx.kernel_size), None),
    setup_context=_weight_to_filters_setup_context)
torch.library.register_autograd(
    "spconv::filters_to_weight",
    lambda ctx, grad: (torch.ops.spconv.weight_to_filters(grad.contiguous(), ctx.groups), None),
    setup_context=_filters_to_weight_setup_context)


def weight_to_filters(weight: torch.Tensor, groups: int = 1) -> torch.Tensor:
    """Filters ``[kvol, groups, Cin/groups, Cout/groups]`` of a weight ``[Cout, *kernel, Cin/groups]``;
    differentiable. On the CPU route a native tiled transpose (the op of the same name: it runs on every conv
    call, and torch's strided copy of this permutation took twice its time on a 256 -> 256 3x3x3 weight); on the
    GPU route (and the GPU code run on the CPU in tests) a permuted view, no copy."""
    if weight.device.type == "cpu" and not _backend.runs_gpu_code(weight.device):
        if needs_autograd(weight):
            return torch.ops.spconv.weight_to_filters(weight, groups)
        with below_autograd():
            return torch.ops.spconv.weight_to_filters(weight, groups)
    cout, cig = weight.shape[0], weight.shape[-1]
    # A view: the GPU ops read the filters in place (native route) or copy them once inside (fused, grouped), and
    # the weight's gradient keeps its layout.
    return weight.reshape(groups, cout // groups, -1, cig).permute(2, 0, 3, 1)


def dense_filters(weight: torch.Tensor) -> torch.Tensor:
    """The ``[kvol, Cin, Cout]`` filters of a weight with one group (``weight_to_filters`` without the groups
    dimension); differentiable."""
    return weight_to_filters(weight).view(-1, weight.shape[-1], weight.shape[0])


# ---- pooling (native route): wrappers, fake kernels, autograd ----

@_backend.register_fake("indice_maxpool")
def _indice_maxpool_fake(features, pair_in, pair_out, pair_offsets, num_out, map_info=None):
    return features.new_empty((num_out, features.shape[1]))


@_backend.register_fake("indice_maxpool_backward")
def _indice_maxpool_backward_fake(features, out_features, out_grad, pair_in, pair_out, pair_offsets, map_info=None):
    return torch.empty_like(features)


@_backend.register_fake("indice_avgpool")
def _indice_avgpool_fake(features, pair_in, pair_out, pair_offsets, num_out, map_info=None):
    return features.new_empty((num_out, features.shape[1])), pair_in.new_empty((num_out,))


@_backend.register_fake("indice_avgpool_backward")
def _indice_avgpool_backward_fake(out_grad, count, pair_in, pair_out, pair_offsets, num_in, map_info=None):
    return out_grad.new_empty((num_in, out_grad.shape[1]))


def _maxpool_setup_context(ctx, inputs, output):
    features, pair_in, pair_out, pair_offsets = inputs[:4]
    ctx.save_for_backward(features, output, pair_in, pair_out, pair_offsets)
    ctx.map_info = map_info_input(inputs, 5)


def _maxpool_backward(lib, ctx, grad):
    features, out, pair_in, pair_out, pair_offsets = ctx.saved_tensors
    dx = lib.indice_maxpool_backward(features, out, grad.contiguous(), pair_in, pair_out, pair_offsets,
                                     ctx.map_info)
    return dx, None, None, None, None, None


def _avgpool_setup_context(ctx, inputs, output):
    features, pair_in, pair_out, pair_offsets = inputs[:4]
    ctx.save_for_backward(output[1], pair_in, pair_out, pair_offsets)
    ctx.num_in = features.shape[0]
    ctx.map_info = map_info_input(inputs, 5)
    ctx.mark_non_differentiable(output[1])


def _avgpool_backward(lib, ctx, grad, _grad_count):
    count, pair_in, pair_out, pair_offsets = ctx.saved_tensors
    dx = lib.indice_avgpool_backward(grad.contiguous(), count, pair_in, pair_out, pair_offsets, ctx.num_in,
                                     ctx.map_info)
    return dx, None, None, None, None, None


def _register_autograd(namespace: str):
    """The backward formulas of one op library (spconv, or a test library selected by _backend); each backward
    calls the library its forward ran in."""
    lib = getattr(torch.ops, namespace)
    for op, backward, setup in (("indice_conv", _indice_conv_backward, _indice_conv_setup_context),
                                ("indice_maxpool", _maxpool_backward, _maxpool_setup_context),
                                ("indice_avgpool", _avgpool_backward, _avgpool_setup_context)):
        torch.library.register_autograd("%s::%s" % (namespace, op), functools.partial(backward, lib),
                                        setup_context=setup)


_backend.on_op_library(_register_autograd)
