"""The fused gather-GEMM-scatter route (GPU): output-stationary implicit GEMM over a neighbour table.

How it works
  For a kernel map (pairs grouped by kernel offset) ``build_fused_map`` makes an out->in neighbour table
  ``nbr [num_out, kvol]`` (-1 = no input), one offset bit-mask per output row and the rows stably sorted by
  mask (spconv's MaskImplicitGemm idea). ``fused_conv`` gives each GPU block 64 output rows (consecutive in
  mask order, so their masks agree) x 64 output channels; it skips the offsets no row of the tile uses,
  gathers the input rows of each used offset into shared memory and multiplies them by that offset's filter
  slice, accumulating in fp32 registers. Each output is written once: no atomics, deterministic. The mask can
  be split in two or more (``num_splits``): each split has its own row order over its share of the offsets,
  and the splits run one after another (the first writes, the next ones add). A large layer takes two
  (``split_count``, ``SPLIT_WORK``), three on a body that multiplies every row of its tiles (MFMA). Inside a
  tile, a WMMA or pipelined sm_80 warp whose 16 rows have no source at an offset skips its multiplies there
  (docs/routes.md, "Work of the fused route").
  dinput is the same kernel on the reversed map (the table of ``maps.reversed()``) with filters transposed to
  ``[kvol, Cout, Cin]``; dfilter is a per-offset gathered GEMM ``X^T dY`` with split-K partials reduced in a
  fixed order (deterministic, no atomics).
  Backward on a map whose builder kept a table (``fused_conv_backward``, one op, no host read): dfilter reads
  its pairs from that table (column k's entries in row order: the pairs' own order, so the same bits), the
  split count from the device's pair_offsets; the dfilter's reduction also writes the transposed filters for
  dinput. dinput of a mirrored map (submanifold, odd kernel sizes: offset kvol - 1 - k is offset k negated)
  runs on the forward table with its columns reversed: read mirrored with the forward's masks / order of one
  split, or, with more splits, as a reversed copy with masks and order of its own; of a regular conv on the
  builder's in->out table (``maps.in_table``), whose masks and order the first backward makes (cached). So a
  SubM map's pairs are never read by the fused route.
  Kernel bodies, picked by the compile target: SIMT FMA on every GPU; for fp16/bf16 WMMA tensor cores on NVIDIA
  sm_80+ (or the pipelined sm_80 bodies with SPCONV_FUSED_SM80=1, read by the launcher at every launch) and MFMA
  on AMD gfx90a/gfx94x; for fp32 where TF32 is allowed (``allow_tf32``) the TF32 tensor-core body on NVIDIA
  sm_80+. ``torch.ops.spconv.fused_conv_path(x, tf32)`` tells which one runs.

Eligibility (``_route.fused_conv`` returns None otherwise and the caller takes the native route)
  * the features are on a GPU, the GPU kernels are built, and SPCONV_FORCE_NATIVE is not set (checked by
    ``spconv._backend.fused_route_enabled`` by ``spconv.pytorch._route``, which runs this module's tables and
    autograd Function, one call per round of a map that repeats a row at one offset);
  * dtype float32, float16 or bfloat16 (float64 always takes the native route), filters of the same dtype;
  * kernel volume >= 2 (a 1x1 convolution is a plain GEMM, done by the caller) and <= MAX_KVOL;
  * channels: 1 <= Cin, Cout <= MAX_CHANNELS (any count; the 16-byte vector loads of the tensor-core bodies
    are used when Cin and Cout are multiples of 8, element loads otherwise);
  * the number of output rows matches the map, and num_out * kvol < 2**31 (int32 row ids in the table).

The table itself is the kernel-map builder's where it made one in the right direction (``maps.out_table``:
submanifold maps, regular / transposed maps built for a layer where the GPU code runs (``strided_kernel_map``
writes both directions) and their reversed maps); only its masks and order are computed (``fused_map_masks``).
Other maps (built by hand from pairs, or with repeated coordinates) build it from the pairs (``build_fused_map``).
Tables are cached in ``maps.cache`` (so layers sharing an ``indice_key`` build them once):
  ``maps.cache["fused_map_s{S}"] = (nbr, masks, order)`` for the forward, and the same key in
  ``maps.reversed().cache`` for dinput (which is also the forward table of the inverse convolution).
"""
import functools
from types import SimpleNamespace
from typing import Optional, Tuple

import torch
from torch.autograd.function import once_differentiable
from torch.fx.experimental.symbolic_shapes import guard_or_false, statically_known_true

from spconv import _backend, constants  # _backend loads the extension, which defines the ops
from spconv.pytorch._maps import MAP_MIRRORED, map_info_of

SUPPORTED_DTYPES = (torch.float32, torch.float16, torch.bfloat16)
# maps.cache key set by a builder whose map is mirrored (offset kvol - 1 - k is offset k negated).
MIRRORED_KEY = "fused_mirrored"
MAX_KVOL = 4096
MAX_CHANNELS = 16384
# Mask splits of the forward / dinput tables. Two splits halve the offsets each row tile walks, so the rows
# multiplied per neighbour pair drop (1.9 -> 1.4 on the real scan's basic network, docs/routes.md), for one
# more launch and one more pass over the output. That pays once a layer's rows x Cin x Cout reaches SPLIT_WORK:
# about half of 7 pairs per row of multiplies saved at ~50 TMAC/s outweighs a ~5 us launch and the output's
# extra read and write. Smaller layers keep one split (and the map builder's tables).
SPLIT_WORK = 1 << 27
MAX_SPLITS = 4
# Above SPLIT_WORK, a body that multiplies every row of its tiles (MFMA: it cannot skip a row group without
# moving its accumulators between register files on this compiler) takes three splits: on the real scan's basic
# network its computed rows per useful pair go from 1.40 to 1.24 (the bodies that skip idle row groups: 1.24 with
# two, 1.13 with three, which a third pass over the output does not pay for).
WIDE_SPLITS_MFMA = 3


# ---- fake kernels: shapes only, for torch.compile / torch.export / opcheck ----
@_backend.register_fake("build_fused_map")
def _build_fused_map_fake(pair_in, pair_out, pair_offsets, num_rows, num_splits, map_info=None):
    kvol = pair_offsets.shape[0] - 1
    nbr = pair_in.new_empty((num_rows, kvol), dtype=torch.int32)
    masks = pair_in.new_empty((num_splits, num_rows), dtype=torch.int32)
    order = pair_in.new_empty((num_splits, num_rows), dtype=torch.int32)
    return nbr, masks, order


@_backend.register_fake("fused_map_masks")
def _fused_map_masks_fake(nbr, num_splits):
    return (nbr.new_empty((num_splits, nbr.shape[0])), nbr.new_empty((num_splits, nbr.shape[0])))


@_backend.register_fake("fused_conv")
def _fused_conv_fake(features, filters, nbr, masks, order, map_info=None, tf32=False):
    return features.new_empty((nbr.shape[0], filters.shape[2]))


@_backend.register_fake("fused_conv_backward")
def _fused_conv_backward_fake(features, filters, out_grad, nbr, masks, order, mirrored, dw_table, dw_by_output,
                              pair_offsets, need_dx, need_dw, map_info=None, tf32=False):
    dx = features.new_empty(features.shape if need_dx else (0,))
    dw = features.new_empty(filters.shape if need_dw else (0,))
    return dx, dw


@_backend.register_fake("fused_conv_dfilter")
def _fused_conv_dfilter_fake(features, out_grad, pair_in, pair_out, pair_offsets, map_info=None, tf32=False):
    return features.new_empty((pair_offsets.shape[0] - 1, features.shape[1], out_grad.shape[1]))


# ---- tables ----
def _reversed(maps):
    rev = getattr(maps, "reversed", None)
    if callable(rev):
        return rev()
    cached = maps.cache.get("fused_reversed_maps")
    if cached is None:
        cached = SimpleNamespace(pair_in=maps.pair_out, pair_out=maps.pair_in, pair_offsets=maps.pair_offsets,
                                 num_in=maps.num_out, num_out=maps.num_in, cache={}, map_info=None)
        maps.cache["fused_reversed_maps"] = cached
    return cached


@functools.lru_cache(maxsize=None)
def _multiplies_every_row(library: str, device: torch.device) -> bool:
    """Whether the 16-bit body of ``library`` (the op namespace) on ``device`` multiplies every row of its tiles:
    MFMA on AMD gfx90a / gfx94x, and the HIP CPU build's emulated MFMA variant. A host-side query, no launch."""
    if device.type == "cpu":
        return library.endswith("_mfma")
    if device.type == "cuda" and torch.version.hip:
        arch = getattr(torch.cuda.get_device_properties(device), "gcnArchName", "")
        return arch.startswith(("gfx90a", "gfx94"))
    return False


def wide_split_count(device: Optional[torch.device] = None) -> int:
    """The mask splits of a layer whose work reaches SPLIT_WORK: WIDE_SPLITS_MFMA where the body multiplies every
    row of its tiles, else two."""
    if device is not None and device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device is not None and _multiplies_every_row(_backend.ops.namespace, device):
        return WIDE_SPLITS_MFMA
    return 2


def split_count(kvol: int, num_splits: int = 0, work=0, device: Optional[torch.device] = None) -> int:
    """The mask splits of the tables of a kernel volume: ``num_splits`` when asked for, else, for a layer whose
    rows x Cin x Cout (``work``) reaches SPLIT_WORK, ``wide_split_count(device)`` (two, or three for the bodies
    that multiply every row of a tile) and one otherwise. A traced graph whose row count is symbolic takes one
    split unless every count it allows reaches SPLIT_WORK: a guard on the count would specialize it."""
    if not num_splits:
        num_splits = wide_split_count(device) if statically_known_true(work >= SPLIT_WORK) else 1
    return max(1, min(num_splits, kvol, MAX_SPLITS))


def table_cache_key(splits: int) -> str:
    return "fused_map_s%d" % splits


def table_info(maps) -> Optional[torch.Tensor]:
    """The host record fused_conv takes with the tables of ``maps``: ``maps.table_info`` where the map has one
    (a device-built map gives its row bounds before its pairs exist), else its map_info."""
    info = getattr(maps, "table_info", None)
    return info if info is not None else map_info_of(maps)


def fused_tables(maps, num_splits: int = 0, channels=0) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(nbr, masks, order) of ``maps`` (outputs as rows), built once per split count and cached in
    ``maps.cache``; ``channels`` (Cin x Cout) picks the split count when ``num_splits`` is 0."""
    kvol = maps.pair_offsets.shape[0] - 1
    s = split_count(kvol, num_splits, maps.num_out * channels, maps.pair_offsets.device)
    key = table_cache_key(s)
    tables = maps.cache.get(key)
    if tables is None:
        built = getattr(maps, "out_table", None)  # the map builder's own table, when it kept one
        if built is not None:
            tables = (built, *_backend.ops.fused_map_masks(built, s))
        else:
            tables = _backend.ops.build_fused_map(maps.pair_in, maps.pair_out, maps.pair_offsets, maps.num_out, s,
                                                  map_info_of(maps))
        maps.cache[key] = tables
    return tables


def mark_mirrored(maps, ksize) -> None:
    """Notes that ``maps`` (a submanifold map) is mirrored when every kernel size is odd."""
    if all(k % 2 == 1 for k in ksize):
        maps.cache[MIRRORED_KEY] = True


def _mirrored(maps) -> bool:
    if maps.cache.get(MIRRORED_KEY):
        return True
    if not getattr(maps, "resolved", False) or torch.compiler.is_compiling():
        return False  # (a pending map's builder marks it; its host record comes with the pairs)
    info = maps.info
    return info is not None and bool(int(info.numpy()[-1]) & MAP_MIRRORED)  # a host record: no op


def dinput_tables(maps, num_splits: int = 0, channels=0):
    """(nbr, masks, order, mirrored) of dinput, cached in ``maps.cache``. A mirrored map with its builder's table:
    with one split, the forward table read mirrored (its masks and order of one split); with more, the reversed
    map's table, which is the forward table with its columns reversed (offset k's pairs are offset kvol - 1 - k's
    swapped). Other maps: the reversed map's tables (the builder's in->out table where there is one, else from
    the pairs)."""
    table = getattr(maps, "out_table", None)
    if table is not None and _mirrored(maps):
        s = split_count(table.shape[1], num_splits, maps.num_in * channels, table.device)
        if s == 1:
            return (*fused_tables(maps, 1), True)
        key = "fused_dinput_s%d" % s
        tables = maps.cache.get(key)
        if tables is None:
            flipped = table.flip(1)
            tables = (flipped, *_backend.ops.fused_map_masks(flipped, s))
            maps.cache[key] = tables
        return (*tables, False)
    return (*fused_tables(_reversed(maps), num_splits, channels), False)


def _dfilter_table(maps):
    """(table, rows are outputs) the filter gradient reads its pairs from, or None. The builder's table by
    output (input) is in the order of its pairs by output (input) row."""
    out_table = getattr(maps, "out_table", None)
    if out_table is not None:
        return out_table, True
    in_table = getattr(maps, "in_table", None)
    return None if in_table is None else (in_table, False)


def eligible(features: torch.Tensor, filters: torch.Tensor, maps, num_out: int) -> bool:
    if not _backend.runs_gpu_code(features.device) or filters.device != features.device:
        return False
    return _shape_ok(features, filters, maps, num_out)


def _shape_ok(features, filters, maps, num_out) -> bool:
    if features.dtype not in SUPPORTED_DTYPES or filters.dtype != features.dtype:
        return False
    if features.dim() != 2 or filters.dim() != 3:
        return False
    kvol, cin, cout = filters.shape
    if not (2 <= kvol <= MAX_KVOL) or kvol != maps.pair_offsets.shape[0] - 1:
        return False
    if not (1 <= cin <= MAX_CHANNELS and 1 <= cout <= MAX_CHANNELS) or features.shape[1] != cin:
        return False
    if guard_or_false(num_out != maps.num_out):
        return False
    return _fits_int32(maps.num_out * kvol) and _fits_int32(maps.num_in * kvol)


def _fits_int32(n) -> bool:
    """``n < 2**31`` (the tables hold int32 row ids). A traced graph keeps eager's route (same bits) and
    checks the bound when it runs: an assertion on a host scalar, since a guard on a size that involves the
    graph's inputs would specialize the voxel count."""
    if statically_known_true(n < 2 ** 31):  # plain ints: just the comparison
        return True
    if not isinstance(n, torch.SymInt):
        return False
    torch._assert_async(torch.scalar_tensor(n, dtype=torch.int64) < 2 ** 31,
                        "fused route: rows x kernel volume must stay below 2**31")
    return True


def allow_tf32(features: torch.Tensor) -> bool:
    """Whether an FP32 layer may take TF32 operands: spconv 2.x's switch (``spconv.constants.SPCONV_ALLOW_TF32``)
    or torch's for FP32 matrix products (``torch.backends.cuda.matmul.allow_tf32``, which the native route's GEMMs
    follow). Off by default in both; read at every call."""
    if features.dtype != torch.float32:
        return False
    return bool(constants.SPCONV_ALLOW_TF32) or torch.backends.cuda.matmul.allow_tf32


class FusedConvFunction(torch.autograd.Function):
    """out = fused_conv(features, filters) over ``maps``; backward: dinput on the reversed table, split-K dfilter."""

    @staticmethod
    def forward(ctx, features, filters, maps, num_splits):
        channels = filters.shape[1] * filters.shape[2]
        nbr, masks, order = fused_tables(maps, num_splits, channels)
        tf32 = allow_tf32(features)
        out = _backend.ops.fused_conv(features, filters, nbr, masks, order, table_info(maps), tf32)
        if ctx.needs_input_grad[0] and (getattr(maps, "in_table", None) is not None or masks.shape[0] > 1):
            # Dinput tables that are not this forward's (a regular conv's in->out table from its builder, a
            # mirrored map's reversed table) get their masks and order now, once per map, so that the backward
            # is its one op's launches alone.
            dinput_tables(maps, num_splits, channels)
        ctx.maps = maps
        ctx.num_splits = num_splits
        ctx.channels = channels
        ctx.tf32 = tf32
        ctx.save_for_backward(features, filters)
        return out

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_out):
        features, filters = ctx.saved_tensors
        maps = ctx.maps
        grad_out = grad_out.to(features.dtype).contiguous()
        need_dx, need_dw = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        dw_table = _dfilter_table(maps)
        if dw_table is not None:
            table, by_output = dw_table
            nbr, masks, order, mirrored = (dinput_tables(maps, ctx.num_splits, ctx.channels) if need_dx else
                                           (table,) * 3 + (False,))
            dx, dw = _backend.ops.fused_conv_backward(features, filters, grad_out, nbr, masks, order, mirrored, table,
                                                      by_output, maps.pair_offsets, need_dx, need_dw, table_info(maps),
                                                      ctx.tf32)
            return (dx if need_dx else None), (dw if need_dw else None), None, None
        dx = dw = None
        if ctx.needs_input_grad[0]:
            rev = _reversed(maps)
            nbr, masks, order = fused_tables(rev, ctx.num_splits, ctx.channels)
            dx = _backend.ops.fused_conv(grad_out, filters.transpose(1, 2).contiguous(), nbr, masks, order,
                                         table_info(rev), ctx.tf32)
        if ctx.needs_input_grad[1]:
            dw = _backend.ops.fused_conv_dfilter(features, grad_out, maps.pair_in, maps.pair_out, maps.pair_offsets,
                                                 map_info_of(maps), ctx.tf32)
        return dx, dw, None, None
