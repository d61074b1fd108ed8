"""Table modules: combine several SparseConvTensors (spconv 2.x: ``spconv.pytorch.tables``).

``AddTable`` and ``JoinTable`` need operands on the same coordinates in the same row order (outputs of layers
that share a kernel map, e.g. a residual branch of SubM convs); ``AddTableMisaligned`` adds tensors on different
coordinate sets. Unlike spconv 2.3.8, ``JoinTable`` accepts operands with different channel counts (spconv
asserts equal counts, which defeats a channel concat) and the checks raise ``ValueError`` instead of asserting.
"""
from typing import List

import torch

from spconv.pytorch import functional as Fsp
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.modules import SparseModule


def _check_aligned(tensors: List[SparseConvTensor], who: str, same_channels: bool):
    if not isinstance(tensors, (list, tuple)) or len(tensors) == 0:
        raise ValueError(f"{who} expects a non-empty list of SparseConvTensors")
    first = tensors[0]
    for i, t in enumerate(tensors):
        if not isinstance(t, SparseConvTensor):
            raise TypeError(f"{who}: input {i} is a {type(t).__name__}, not a SparseConvTensor")
        t.check_consistent(f"{who} input {i}")
        if t.spatial_shape != first.spatial_shape or t.batch_size != first.batch_size:
            raise ValueError(f"{who}: input {i} has spatial_shape {t.spatial_shape} and batch_size {t.batch_size}, "
                             f"input 0 has {first.spatial_shape} and {first.batch_size}")
        if t.indices.shape[0] != first.indices.shape[0]:
            raise ValueError(f"{who}: input {i} has {t.indices.shape[0]} active sites, input 0 has "
                             f"{first.indices.shape[0]}; use AddTableMisaligned / sparse_add for different "
                             "coordinate sets")
        if same_channels and t.features.shape[1] != first.features.shape[1]:
            raise ValueError(f"{who}: input {i} has {t.features.shape[1]} channels, input 0 has "
                             f"{first.features.shape[1]}")


def _like_first(tensors: List[SparseConvTensor], features: torch.Tensor) -> SparseConvTensor:
    # The result keeps input 0's coordinates and kernel maps, and the bookkeeping of the last operand as spconv.
    out = tensors[0].replace_feature(features)
    last = tensors[-1]
    out.benchmark_record = last.benchmark_record
    out.thrust_allocator = last.thrust_allocator
    out._timer = last._timer
    return out


class JoinTable(SparseModule):
    """Concatenates the features of aligned tensors along channels."""

    def forward(self, input: List[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "JoinTable", same_channels=False)
        return _like_first(input, torch.cat([t.features for t in input], 1))

    def input_spatial_size(self, out_size):
        return out_size


class AddTable(SparseModule):
    """Sums the features of aligned tensors (same coordinates in the same order)."""

    def forward(self, input: List[SparseConvTensor]) -> SparseConvTensor:
        _check_aligned(input, "AddTable", same_channels=True)
        total = input[0].features
        for t in input[1:]:
            total = total + t.features
        return _like_first(input, total)

    def input_spatial_size(self, out_size):
        return out_size


class AddTableMisaligned(SparseModule):
    """Sums tensors on different coordinate sets (``functional.sparse_add_hash_based``).

    The result keeps kernel maps only when its coordinates are exactly one operand's (see ``sparse_add``).
    """

    def forward(self, input: List[SparseConvTensor]) -> SparseConvTensor:
        return Fsp.sparse_add_hash_based(*input)

    def input_spatial_size(self, out_size):
        return out_size


class ConcatTable(SparseModule):
    """Runs every child on the same input and returns the list of results."""

    def forward(self, input):
        return [module(input) for module in self._modules.values()]

    def add(self, module):
        self._modules[str(len(self._modules))] = module
        return self

    def input_spatial_size(self, out_size):
        return self._modules["0"].input_spatial_size(out_size)


class RemoveDuplicate(SparseModule):
    """Keeps the first row of every repeated coordinate (rows stay in first-occurrence order).

    The input is not modified; the result has no kernel maps (its rows differ from the input's).
    """

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        if not isinstance(x, SparseConvTensor):
            raise TypeError(f"RemoveDuplicate expects a SparseConvTensor, got {type(x).__name__}")
        x.check_consistent("RemoveDuplicate")
        keys = Fsp.linear_coordinate_keys(x.indices, x.spatial_shape)
        first = Fsp.first_occurrence_rows(keys)
        out = x.with_structure(x.features[first], x.indices[first], x.spatial_shape, {})
        return out
