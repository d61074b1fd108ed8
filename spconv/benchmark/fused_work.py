"""What the fused route's kernels compute against the useful work, read exactly from a layer's tables.

The forward kernel (csrc/hip/fused_conv.cu) gives each block TILE_ROWS rows, consecutive in one split's mask
order, and walks every offset whose mask bit is set in the OR of their masks; for each it gathers all the
block's rows. So a tile pays TILE_ROWS rows per offset it walks (``tile`` ratio: gathers and barriers).
Inside the tile a WMMA or pipelined sm_80 warp multiplies GROUP_ROWS rows and skips an offset where none of them
has a source (``mma`` ratio: its multiply-adds; the SIMT body skips per thread's 4 rows, finer; the MFMA body
multiplies every row of the tile, so for it the ``tile`` ratio applies).
Useful work is one row per neighbour pair. Both ratios count rows; channel padding is not counted.

The tables are the route's own (``_fused.fused_tables``, ``_fused.dinput_tables``: built and cached on the map as
a layer's first call would), with the split count it picks for the layer (``_fused.split_count``); a mirrored
map's dinput read mirrored does the same work as the reversed table.
"""
from dataclasses import dataclass
from typing import Dict

import torch

from spconv.pytorch import _fused

TILE_ROWS = 64
GROUP_ROWS = 16


@dataclass
class TableWork:
    pairs: int  # useful rows: entries >= 0 of the table
    tile_rows: int  # rows gathered: TILE_ROWS per walked offset per tile
    mma_rows: int  # rows multiplied: GROUP_ROWS per walked offset per row group with a source
    splits: int

    @property
    def tile_ratio(self) -> float:
        return self.tile_rows / self.pairs if self.pairs else 1.0

    @property
    def mma_ratio(self) -> float:
        return self.mma_rows / self.pairs if self.pairs else 1.0


def table_work(nbr: torch.Tensor, masks: torch.Tensor, order: torch.Tensor) -> TableWork:
    """The work of the forward kernel on tables (nbr [rows, kvol], masks / order [splits, rows])."""
    nbr, masks, order = nbr.cpu(), masks.cpu(), order.cpu()
    rows, kvol = nbr.shape
    splits = masks.shape[0]
    tiles = -(-rows // TILE_ROWS)
    has = nbr >= 0
    tile_rows = mma_rows = 0
    for s in range(splits):
        k0, k1 = s * kvol // splits, (s + 1) * kvol // splits
        gs = max(1, (k1 - k0 + 31) // 32)
        pad = tiles * TILE_ROWS - rows
        seq = order[s].long()  # the split's rows in mask order, padded to whole tiles below
        src = torch.cat([has[seq, k0:k1], has.new_zeros((pad, k1 - k0))])  # [tiles * TILE_ROWS, width]
        m = torch.cat([masks[s, seq].long() & 0xFFFFFFFF, masks.new_zeros(pad, dtype=torch.long)])
        m = m.view(tiles, TILE_ROWS)
        tile_mask = torch.zeros(tiles, dtype=torch.long)
        for r in range(TILE_ROWS):
            tile_mask |= m[:, r]
        bit = torch.arange(k1 - k0) // gs
        walked = ((tile_mask[:, None] >> bit[None, :]) & 1).bool()  # [tiles, width]
        tile_rows += TILE_ROWS * int(walked.sum())
        live = src.view(tiles, TILE_ROWS // GROUP_ROWS, GROUP_ROWS, k1 - k0).any(2)
        mma_rows += GROUP_ROWS * int((live & walked[:, None, :]).sum())
    return TableWork(int(has.sum()), tile_rows, mma_rows, splits)


def layer_work(maps, cin: int, cout: int) -> Dict[str, object]:
    """Splits and row ratios of a layer's forward and dinput, for the benchmark's per-layer table."""
    fwd = table_work(*_fused.fused_tables(maps, 0, cin * cout))
    dx = table_work(*_fused.dinput_tables(maps, 0, cin * cout)[:3])
    return {"fused_splits": fwd.splits, "fused_fwd_tile": round(fwd.tile_ratio, 3),
            "fused_fwd_mma": round(fwd.mma_ratio, 3), "fused_dx_tile": round(dx.tile_ratio, 3),
            "fused_dx_mma": round(dx.mma_ratio, 3)}

