"""Helpers for the pooling / module / table / end-to-end tests: random sparse tensors and dense views."""
from typing import Sequence

import numpy as np
import torch

import spconv.pytorch as spconv


def make_sparse(shape: Sequence[int], batch_size: int, channels: int, n: int, seed: int = 0,
                dtype=torch.float32, positive: bool = False) -> spconv.SparseConvTensor:
    """``n`` distinct random sites (capped at the grid volume) with random features."""
    g = torch.Generator().manual_seed(seed)
    volume = batch_size * int(np.prod(shape))
    flat = torch.randperm(volume, generator=g)[:min(n, volume)]
    coords = []
    for s in reversed(list(shape)):
        coords.append(flat % s)
        flat = flat // s
    coords.append(flat)
    indices = torch.stack(coords[::-1], dim=1).int()
    feats = torch.randn(indices.shape[0], channels, generator=g, dtype=torch.float64)
    if positive:
        feats = feats.abs() + 0.1
    return spconv.SparseConvTensor(feats.to(dtype), indices, list(shape), batch_size)


def with_features(x: spconv.SparseConvTensor, features: torch.Tensor) -> spconv.SparseConvTensor:
    return spconv.SparseConvTensor(features, x.indices, x.spatial_shape, x.batch_size)


def gather_sites(dense: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """Channels-first dense ``[B, C, *spatial]`` read at ``indices [N, 1 + ndim]`` -> ``[N, C]``."""
    return dense.movedim(1, -1)[tuple(indices.long().t())]


def occupancy(x: spconv.SparseConvTensor) -> torch.Tensor:
    """``[B, 1, *spatial]`` with 1 at active sites."""
    ones = spconv.SparseConvTensor(torch.ones(x.indices.shape[0], 1, dtype=x.features.dtype), x.indices,
                                   x.spatial_shape, x.batch_size)
    return ones.dense()


def sorted_rows(indices: torch.Tensor, features: torch.Tensor):
    """Rows sorted by coordinates, for comparing outputs whose row order is not promised."""
    key = indices.long()
    order = np.lexsort(key.t().flip(0).numpy())
    order = torch.from_numpy(order)
    return indices[order], features[order]
