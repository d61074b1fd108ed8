"""Kernel maps whose rows repeat within one kernel offset, split into rounds that don't.

Duplicate input coordinates (accepted by regular and transposed convs and pools, where they act as one site
holding their summed features) give an output row two or more pairs at one offset. The CPU route sums them.
The GPU kernels can't: the fused route's neighbour table holds one input per (output, offset), and the native
GPU scatter-add and pooling kernels update a row once per launch without atomics. So a map is split, once,
into rounds: round r holds every (row, offset)'s r-th pair (in pair order), so no round repeats a row at an
offset on either side. Convolution is linear: the sum over the rounds is the convolution over the map, in
both directions and for the filter gradient. Maps without repeats (all submanifold maps, and every map of
unique coordinates) are one round, themselves, at the cost of one check per map. Running a layer over the
rounds and summing them is ``spconv.pytorch._route.over_rounds``.
"""
from typing import List

import torch

from spconv.pytorch._maps import PairMaps, make_map_info

_CACHE_KEY = "repeat_rounds"


def _offset_of_pairs(maps) -> torch.Tensor:
    kvol = maps.pair_offsets.shape[0] - 1
    return torch.repeat_interleave(torch.arange(kvol, device=maps.pair_in.device),
                                   maps.pair_offsets[1:] - maps.pair_offsets[:-1])


def rank_within_groups(keys: torch.Tensor) -> torch.Tensor:
    """rank[p] = how many q < p have keys[q] == keys[p] (int64)."""
    n = keys.numel()
    if n == 0:
        return keys.new_zeros((0,), dtype=torch.long)
    sk, perm = torch.sort(keys, stable=True)
    pos = torch.arange(n, device=keys.device)
    first = torch.ones(n, dtype=torch.bool, device=keys.device)
    first[1:] = sk[1:] != sk[:-1]
    start = torch.cummax(torch.where(first, pos, torch.zeros_like(pos)), 0).values
    rank = torch.empty_like(pos)
    rank[perm] = pos - start
    return rank


def _split_side(maps, side: str) -> List:
    rows = maps.pair_out if side == "out" else maps.pair_in
    num_rows = maps.num_out if side == "out" else maps.num_in
    if rows.numel() == 0:
        return [maps]
    k = _offset_of_pairs(maps)
    rank = rank_within_groups(k * max(num_rows, 1) + rows.long())
    rounds = int(rank.max()) + 1  # the one host sync of the check
    if rounds == 1:
        return [maps]
    kvol = maps.pair_offsets.shape[0] - 1
    parts = []
    for r in range(rounds):
        pick = rank == r  # keeps pair order: offsets ascending, then the map's order within an offset
        counts = torch.bincount(k[pick], minlength=kvol)
        offsets = torch.cat([counts.new_zeros(1), torch.cumsum(counts, 0)])
        info = None if maps.info is None else make_map_info(offsets, maps.info[-3], maps.info[-2], True)
        parts.append(PairMaps(maps.pair_in[pick].contiguous(), maps.pair_out[pick].contiguous(), offsets,
                              maps.num_in, maps.num_out, info=info))
    return parts


def split_rounds(maps) -> List:
    """``maps`` as rounds without a row repeated at one offset on either side; ``[maps]`` when none repeats.

    Computed once per map and cached in ``maps.cache`` (the rounds of ``maps.reversed()`` are the reversed
    rounds). A map marked ``repeat_free`` (submanifold maps: their builder rejects duplicates) is not checked.
    """
    cached = maps.cache.get(_CACHE_KEY)
    if cached is not None:
        return cached
    if torch.compiler.is_compiling():
        # The number of rounds is data: a traced graph (torch.compile, torch.export) takes the map as one round.
        # The fused route's table builder refuses a repeated (output, offset) at run time; the native GPU route
        # and GPU pooling in a traced graph need unique input coordinates (docs/deployment.md).
        return [maps]
    rev = getattr(maps, "_reversed", None)
    if getattr(maps, "repeat_free", False):
        parts = [maps]
    elif rev is not None and _CACHE_KEY in rev.cache:
        parts = [maps] if len(rev.cache[_CACHE_KEY]) == 1 else [p.reversed() for p in rev.cache[_CACHE_KEY]]
    else:
        parts = [q for p in _split_side(maps, "out") for q in _split_side(p, "in")]
    for p in parts:
        if p is not maps:
            p.repeat_free = True
    maps.cache[_CACHE_KEY] = parts
    if rev is not None and _CACHE_KEY not in rev.cache:
        rev.cache[_CACHE_KEY] = [rev] if len(parts) == 1 else [p.reversed() for p in parts]
    return parts


def has_repeats(maps) -> bool:
    return len(split_rounds(maps)) > 1
