"""Kernel-map records: ``PairMaps`` (one layer's (input, output) pairs per kernel offset), its host record
(``map_info``), the identity map of 1x1 convolutions and spconv 2.x's native pair layout. Ground floor: no
import from the rest of ``spconv.pytorch`` but ``_symsize``."""
import functools
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from spconv.pytorch._symsize import as_size

# map_info's flag bits (csrc/ops/checks.h: kMapRepeatFree, kMapMirrored).
MAP_REPEAT_FREE, MAP_MIRRORED = 1, 2


def make_map_info(offsets_host: torch.Tensor, in_rows: int, out_rows: int, repeat_free: bool) -> torch.Tensor:
    """The host record of a map (``get_indice_pairs``' ``map_info``, csrc/ops/checks.h): int64 on the CPU,
    pair_offsets then in_rows, out_rows and the flags (MAP_REPEAT_FREE; the C++ builders may add MAP_MIRRORED)."""
    flags = MAP_REPEAT_FREE if repeat_free else 0
    extras = torch.tensor([int(in_rows), int(out_rows), flags], dtype=torch.int64)
    return torch.cat([offsets_host.to(device="cpu", dtype=torch.int64).reshape(-1), extras])


def identity_map(n: int, device: torch.device):
    """The identity map of n rows (row i feeds row i), for kernel-volume-1 convs without a stored map: pairs int32
    [n], pair offsets [0, n] and the host record (None while tracing: the ops then check the map themselves).
    Cached per size: a network's 1x1 convs see a few row counts, over and over."""
    if torch.compiler.is_compiling():
        return (*_identity_rows(n, device), None)
    return _cached_identity_map(n, device)


def _identity_rows(n: int, device: torch.device):
    return (torch.arange(n, dtype=torch.int32, device=device),
            torch.tensor([0, n], dtype=torch.int64, device=device))


@functools.lru_cache(maxsize=16)
def _cached_identity_map(n: int, device: torch.device):
    rows, offsets = _identity_rows(n, device)
    return rows, offsets, make_map_info(offsets, n, n, True)


def map_info_of(maps) -> Optional[torch.Tensor]:
    """The ops' ``map_info`` argument for ``maps``: its host record, or None (maps that are not PairMaps, traced
    graphs), when the ops check the map themselves."""
    return getattr(maps, "map_info", None)


def map_info_input(inputs, n: int) -> Optional[torch.Tensor]:
    """The optional ``map_info`` input (position n) of an op's inputs in an autograd setup_context."""
    return inputs[n] if len(inputs) > n else None


class PairMaps:
    """The kernel map of one layer: per kernel offset, the (input row, output row) pairs.

    ``pair_in[p]`` feeds ``pair_out[p]`` through offset ``k`` for ``pair_offsets[k] <= p < pair_offsets[k+1]``.
    ``cache`` holds tables derived from it (the fused route's neighbour tables), shared by every layer
    that reuses the map through an ``indice_key``. ``info`` is the map's host record (``make_map_info``) when
    its builder gave one: the ops then check the map without copying anything from the GPU. ``out_table`` /
    ``in_table``: the builder's neighbour table by output (``[num_out, kvol]``, the input feeding each) or by
    input (``[num_in, kvol]``, the output each feeds), kept for maps on a GPU so that the fused route takes it
    instead of building it again. A map built on the GPU without a host read (submanifold maps) gives ``pending``
    instead of the pairs: ``pair_in``, ``pair_out`` and ``info`` are made by it, once, when first read.
    """

    def __init__(self, pair_in: Optional[torch.Tensor], pair_out: Optional[torch.Tensor], pair_offsets: torch.Tensor,
                 num_in: int, num_out: int, repeat_free: bool = False, info: Optional[torch.Tensor] = None,
                 out_table: Optional[torch.Tensor] = None, in_table: Optional[torch.Tensor] = None,
                 pending: Optional[Callable[[], Tuple[torch.Tensor, torch.Tensor, torch.Tensor]]] = None):
        self._pair_in = pair_in
        self._pair_out = pair_out
        self.pair_offsets = pair_offsets
        self.num_in = as_size(num_in)  # SymInts while tracing
        self.num_out = as_size(num_out)
        self._info = info
        # pending() -> (pair_in, pair_out, info): a map built on the device whose pairs are compacted (with the
        # map's one host read) when first asked for; its builder gave repeat_free and the tables.
        self._pending = pending
        self._rows_info: Optional[torch.Tensor] = None
        self.out_table = out_table
        self.in_table = in_table
        # True when no row repeats within one offset on either side (known for submanifold maps, and from
        # the GPU builder's info); else spconv.pytorch.pair_rounds checks once.
        if info is not None and not repeat_free and not torch.compiler.is_compiling():
            repeat_free = bool(int(info.numpy()[-1]) & MAP_REPEAT_FREE)  # from the host record, without an op
        self.repeat_free = bool(repeat_free)
        self.cache: Dict[str, Any] = {}
        self._reversed: Optional["PairMaps"] = None

    def _resolve(self):
        if self._pending is not None:
            pending, self._pending = self._pending, None
            self._pair_in, self._pair_out, self._info = pending()

    @property
    def pair_in(self) -> torch.Tensor:
        self._resolve()
        return self._pair_in

    @property
    def pair_out(self) -> torch.Tensor:
        self._resolve()
        return self._pair_out

    @property
    def info(self) -> Optional[torch.Tensor]:
        self._resolve()
        return self._info

    @property
    def resolved(self) -> bool:
        """Whether the pairs and the host record exist (False for a device-built map not yet asked for them)."""
        return self._pending is None

    @property
    def table_info(self) -> Optional[torch.Tensor]:
        """A host record for the ops that take the builder's tables (``fused_conv``): ``info`` once resolved;
        before, the row bounds alone (the tables index num_in rows and have num_out), with zero pairs per
        offset, so that the tables are used without resolving the map. None while tracing."""
        if torch.compiler.is_compiling():
            return None
        if self._pending is None:
            return self._info
        if self._rows_info is None:  # one host tensor per map, no device work
            self._rows_info = torch.tensor([0] * (self.kernel_volume + 1) + [
                int(self.num_in), int(self.num_out), MAP_REPEAT_FREE if self.repeat_free else 0], dtype=torch.int64)
        return self._rows_info

    @property
    def kernel_volume(self) -> int:
        return self.pair_offsets.shape[0] - 1

    @property
    def map_info(self) -> Optional[torch.Tensor]:
        """``info`` for the ops' ``map_info`` argument; None in traced graphs (the ops check the map there)."""
        return None if torch.compiler.is_compiling() else self.info

    def reversed(self) -> "PairMaps":
        """The same pairs with inputs and outputs swapped (inverse convolution), cached."""
        if self._reversed is None:
            if self._pending is not None:
                rev = PairMaps(None, None, self.pair_offsets, self.num_out, self.num_in, self.repeat_free,
                               out_table=self.in_table, in_table=self.out_table, pending=self._swapped)
            else:
                rev = PairMaps(self.pair_out, self.pair_in, self.pair_offsets, self.num_out, self.num_in,
                               self.repeat_free, self._swapped_info(), out_table=self.in_table,
                               in_table=self.out_table)
            rev._reversed = self
            self._reversed = rev
        return self._reversed

    def _swapped_info(self) -> Optional[torch.Tensor]:
        info = self.info
        return None if info is None else info[[*range(info.shape[0] - 3), -2, -3, -1]]

    def _swapped(self):
        return self.pair_out, self.pair_in, self._swapped_info()

    def to(self, device: torch.device) -> "PairMaps":
        if self.pair_offsets.device == device:
            return self
        key = f"on_{device}"
        if key not in self.cache:
            self.cache[key] = PairMaps(self.pair_in.to(device), self.pair_out.to(device),
                                       self.pair_offsets.to(device), self.num_in, self.num_out, self.repeat_free,
                                       self.info)
        return self.cache[key]

    def pair_counts(self) -> torch.Tensor:
        return self.pair_offsets[1:] - self.pair_offsets[:-1]



def pairs_to_spconv_layout(maps: PairMaps, width: int) -> torch.Tensor:
    kvol = maps.kernel_volume
    counts = maps.pair_counts()
    out = torch.full((2, kvol, max(width, 1)), -1, dtype=torch.int32, device=maps.pair_in.device)
    if maps.pair_in.numel():
        k = torch.repeat_interleave(torch.arange(kvol, device=counts.device), counts)
        col = torch.arange(maps.pair_in.numel(), device=counts.device) - maps.pair_offsets[:-1][k]
        out[0, k, col] = maps.pair_in
        out[1, k, col] = maps.pair_out
    return out[:, :, :width]

