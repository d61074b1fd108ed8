"""The cache of large CPU op outputs (csrc/ops/output_cache.h).

The CPU ops take their outputs of 128 KB and more (the filters each conv call transposes its weight into too)
from a small cache of freed output blocks instead of fresh pages from the OS, which a layer would otherwise fault
in and zero again on every call (half of a depthwise layer's time on a real scan). ``SPCONV_CPU_OUTPUT_CACHE_MB``
(read once, at the first large output) bounds the freed memory it keeps: default 512, 0 turns it off. Tensors are
ordinary CPU tensors; only the memory under them is recycled.
"""
from typing import Dict

import torch

from spconv import _backend

_FIELDS = ("cached_bytes", "cached_blocks", "hits", "misses", "capacity_bytes")


def info() -> Dict[str, int]:
    """Freed memory held now (bytes, blocks), the outputs it served and missed, and its capacity in bytes."""
    return dict(zip(_FIELDS, _backend.debug_ops.cpu_output_cache_info()))


def clear() -> None:
    """Returns every cached block to the OS (blocks under live tensors stay with them)."""
    torch.ops.spconv.cpu_output_cache_clear()
