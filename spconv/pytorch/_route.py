"""The route policy: which op runs a layer's features, on which device, and over which rounds of its map. The one
place that decides; the executors it calls (``_native``, ``_fused``, ``_grouped``, ``_int8``) run one route each.

Policy
  * dense convolution (groups 1): the fused gather-GEMM-scatter route where ``_backend.fused_route_enabled`` and
    the shape is eligible (``_fused.eligible``), else the native route; kernel volume 1 without a stored map is
    one op over the identity map (``conv1x1``);
  * grouped convolution: on the CPU the table kernel for maps that repeat no row at one offset, else the pairs
    kernel (which sums repeats); on a GPU the table kernel, or the pairs kernel with SPCONV_FORCE_NATIVE;
  * int8 convolution: ``int8_route``;
  * pooling: ``pool_route``.
Rounds: the GPU kernels update a row once per offset, so where the GPU code runs a map that repeats a row at one
offset (duplicate coordinates) runs as its rounds (``pair_rounds.split_rounds``) and the outputs are summed
(``over_rounds``); the CPU route sums repeats itself.
"""
import weakref
from typing import Callable, List, Optional, Tuple

import torch

from spconv import _backend, constants
from spconv.pytorch import _fused, _grouped, _int8, _native, _pool_table, pair_rounds
from spconv.pytorch._maps import PairMaps, identity_map
from spconv.pytorch._qview import as_qint8, int_view

_ops = _backend.ops  # the selected op library (torch.ops.spconv unless a test swaps it)


# ---- the rounds helper ----

def sum_rounds(outs: List[torch.Tensor]) -> torch.Tensor:
    """The rounds' outputs added in round order, in FP32 for 16-bit dtypes (rounded once at the end)."""
    acc_t = torch.float32 if outs[0].dtype in (torch.float16, torch.bfloat16) else outs[0].dtype
    acc = outs[0].to(acc_t)
    for o in outs[1:]:
        acc = acc + o.to(acc_t)
    return acc.to(outs[0].dtype)


def over_rounds(run: Callable, maps):
    """``run(maps)`` over the rounds of ``maps`` (one call per round), summed with ``sum_rounds``: position by
    position where ``run`` returns a tuple (a backward's gradients). A map without repeats is its one round."""
    parts = pair_rounds.split_rounds(maps)
    if len(parts) == 1:
        return run(parts[0])
    outs = [run(p) for p in parts]
    if isinstance(outs[0], tuple):
        return tuple(sum_rounds(list(o)) for o in zip(*outs))
    return sum_rounds(outs)


def on_device_rounds(run: Callable, maps, device: torch.device):
    """``over_rounds`` where the GPU code runs for ``device``; ``run(maps)`` on the CPU route."""
    if _backend.runs_gpu_code(device):
        return over_rounds(run, maps)
    return run(maps)


# ---- dense convolution ----

# layer -> (weak reference to its weight, the weight's identity key, the dense filters); beside the layers rather
# than on them, so that pickling or copying a layer never carries it.
_dense_filters: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def layer_filters(layer, weight: torch.Tensor, features: torch.Tensor) -> torch.Tensor:
    """A layer's ``[kvol, Cin, Cout]`` filters. Without a gradient on the fused route, the dense copy its kernels
    read is kept for the layer while the weight stays the same tensor, storage, version, dtype and device, so that
    an inference layer launches its kernel alone; otherwise the differentiable permutation (``weight_to_filters``)."""
    if _native.needs_autograd(weight, features) or not _backend.fused_route_enabled(features.device):
        return _native.dense_filters(weight)
    key = (weight.data_ptr(), weight._version, weight.dtype, weight.device, tuple(weight.shape))
    cached = _dense_filters.get(layer)
    if cached is None or cached[0]() is not weight or cached[1] != key:
        with torch.no_grad():
            filters = _native.dense_filters(weight).contiguous()
        cached = (weakref.ref(weight), key, filters)
        _dense_filters[layer] = cached
    return cached[2]


def conv_features(features: torch.Tensor, filters: torch.Tensor, maps: PairMaps, num_out: int) -> torch.Tensor:
    """Runs one sparse convolution on the route the dispatcher picks; differentiable in features and filters."""
    maps = maps.to(features.device)
    return on_device_rounds(lambda p: _conv_one(features, filters, p, num_out), maps, features.device)


def _conv_one(features: torch.Tensor, filters: torch.Tensor, maps: PairMaps, num_out: int) -> torch.Tensor:
    if _backend.fused_route_enabled(features.device):
        out = fused_conv(features, filters, maps, num_out)
        if out is not None:
            return out
    return _native.indice_conv_native(features, filters, maps, num_out)


def conv1x1(features: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """A 1x1 convolution (kernel volume 1, stride 1): ``features @ matrix``, matrix ``[Cin, Cout]``. On the CPU
    it runs as the native op over the identity map: the vendor GEMM's own threading splits the products by the
    thread count, and on some CPUs (Intel's, with MKL) that changes dW's bits with torch.set_num_threads; the
    native route's fixed row blocks and split-K segments don't."""
    if _backend.runs_gpu_code(features.device):
        return torch.mm(features, matrix)
    n = features.shape[0]
    ident, offsets, info = identity_map(n, features.device)
    if _native.needs_autograd(features, matrix):
        return _ops.indice_conv(features, matrix.unsqueeze(0), ident, ident, offsets, n, info)
    with _native.below_autograd():
        return _ops.indice_conv(features, matrix.unsqueeze(0), ident, ident, offsets, n, info)


def fused_conv_unchecked(features: torch.Tensor, filters: torch.Tensor, maps, num_splits: int = 0) -> torch.Tensor:
    """The fused convolution on any device (the CPU runs the reference kernels), without the route policy.

    A map that repeats a row at one offset (duplicate coordinates) runs as its rounds (``pair_rounds``): a
    neighbour table holds one input per (output, offset)."""
    filters = filters.contiguous()  # the kernels read it densely: one copy, which the backward also reads
    return over_rounds(lambda p: _fused.FusedConvFunction.apply(features.contiguous(), filters, p, num_splits), maps)


def fused_conv(features: torch.Tensor, filters: torch.Tensor, maps, num_out: int) -> Optional[torch.Tensor]:
    """The fused route for one convolution, or None when the shape is not eligible (``_fused``'s docstring).

    features [num_in, Cin]; filters [kvol, Cin, Cout] (autograd-tracked); maps has pair_in, pair_out,
    pair_offsets, num_in, num_out and a dict ``cache``. Returns [num_out, Cout], differentiable in both.
    """
    if not _fused.eligible(features, filters, maps, num_out):
        return None
    return fused_conv_unchecked(features, filters, maps)


# ---- grouped convolution ----

def conv_grouped(features: torch.Tensor, filters: torch.Tensor, maps, num_out: int) -> torch.Tensor:
    """One grouped sparse convolution on the route for its device; differentiable in features and filters.

    features [num_in, Cin]; filters [kvol, groups, Cin/groups, Cout/groups]; returns [num_out, Cout].
    """
    maps = maps.to(features.device)
    features = features.contiguous()
    if not _backend.runs_gpu_code(features.device):
        if not getattr(maps, "repeat_free", False):  # the pairs route sums rows repeated at one offset
            return _grouped.pairs_conv(features, filters, maps, num_out)
        return _grouped.table_conv(features, filters, maps)
    return over_rounds(lambda p: _grouped_gpu_one(features, filters, p, num_out), maps)


def _grouped_gpu_one(features, filters, maps, num_out):
    if constants.SPCONV_FORCE_NATIVE:
        return _grouped.pairs_conv(features, filters, maps, num_out)
    return _grouped.table_conv(features, filters, maps)


conv1x1_grouped = _grouped.conv1x1_grouped  # kernel volume 1 without a map: one route on every device


# ---- int8 convolution ----

def int8_route(device: torch.device) -> str:
    """The int8 route for tensors on ``device``: "cpu" (the CPU kernel), "fused" (the GPU table kernel) or
    "native" (the GPU code with SPCONV_FORCE_NATIVE: gather, vendor int8 GEMM, scatter-add, epilogue)."""
    if not _backend.runs_gpu_code(device):
        return "cpu"
    return "fused" if _backend.fused_route_enabled(device) else "native"


def int8_conv(features: torch.Tensor, filters: torch.Tensor, maps: Optional[PairMaps], num_out: int,
              channel_scale: torch.Tensor, bias: Optional[torch.Tensor], output_scale: float,
              residual: Optional[torch.Tensor], activation: str, alpha: float) -> torch.Tensor:
    """qint8 features [N, Cin] -> qint8 [num_out, Cout] with scale ``output_scale``.

    ``maps``: the layer's kernel map, None for a 1x1 convolution (output row r reads input row r).
    ``channel_scale = input_scale * weight_scales / output_scale`` and ``bias`` already divided by
    ``output_scale`` (spconv 2.x's arguments); ``residual``: a qint8 tensor added before the activation.
    The route follows the float convs' policy: the table kernel (``quantized_conv``) on the CPU and on the
    GPU's fused route; with SPCONV_FORCE_NATIVE on a GPU, gather -> vendor int8 GEMM -> int32 scatter-add ->
    the same epilogue. Both give the same bits (exact integer sums, one rounding order)."""
    x, scale, b, res, res_scale, act = _int8.prepare(features, channel_scale, bias, output_scale, residual,
                                                     activation)
    dev = x.device
    if maps is not None:
        maps = maps.to(dev)
    if int8_route(dev) == "native":
        out = _int8.native_conv(x, filters, maps, num_out, scale, b, res, res_scale, act, alpha)
    else:
        out = _int8.table_conv(x, filters, maps, scale, b, res, res_scale, act, alpha)
    return as_qint8(out, output_scale)


def int8_maxpool(features: torch.Tensor, maps, num_out: int) -> torch.Tensor:
    """Integer max pool of qint8 features: ``max(0, window max)`` like the float pool, the input's scale kept."""
    out = indice_maxpool_native(int_view(features).contiguous(), maps, num_out)
    return as_qint8(out, features.q_scale())


# ---- pooling ----

def pool_route(features: torch.Tensor, maps: PairMaps):
    """(op library, map) for pooling ``features``: the selected library with the map on the features' device,
    or the CPU route with the map on the CPU when the GPU kernels can't take the map.

    The GPU pooling kernels take one input per (output, offset) (neighbour tables, or one launch per offset over
    the pairs); a map repeating an output at one offset (duplicate coordinates) pools on the CPU instead (slow,
    but exact and rare). Autograd follows the copies. The layers' pools on the GPU then take the table ops
    (spconv.pytorch._pool_table).
    """
    maps = maps.to(features.device)
    if _backend.runs_gpu_code(features.device) and pair_rounds.has_repeats(maps):
        return torch.ops.spconv, maps.to(torch.device("cpu"))
    return _ops, maps


def indice_maxpool_native(features: torch.Tensor, maps: PairMaps, num_out: int) -> torch.Tensor:
    """``max(0, max of the window's active inputs)`` per output (spconv's max-pool semantics)."""
    lib, m = pool_route(features, maps)
    if lib is _ops and _pool_table.eligible(features, m, num_out, maximum=True):
        return _pool_table.maxpool(features, m)  # GPU: one launch over the map's neighbour tables
    x = features.to(m.pair_in.device)
    return lib.indice_maxpool(x, m.pair_in, m.pair_out, m.pair_offsets, num_out, m.map_info).to(features.device)


def indice_avgpool_native(features: torch.Tensor, maps: PairMaps, num_out: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Mean over the window's active inputs per output, and the int32 count of those inputs."""
    lib, m = pool_route(features, maps)
    if lib is _ops and _pool_table.eligible(features, m, num_out, maximum=False):
        return _pool_table.avgpool(features, m)
    x = features.to(m.pair_in.device)
    out, count = lib.indice_avgpool(x, m.pair_in, m.pair_out, m.pair_offsets, num_out, m.map_info)
    return out.to(features.device), count.to(features.device)
