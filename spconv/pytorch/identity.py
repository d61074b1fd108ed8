"""``spconv.pytorch.identity`` (spconv 2.x): a module that returns its input.

A plain ``nn.Module`` as in spconv 2.x (not a SparseModule: inside SparseSequential it gets ``.features``, which
it returns unchanged, so the tensor passes through either way).
"""
from torch import nn


class Identity(nn.Module):
    """Returns its input unchanged (a SparseConvTensor, a list of them, or anything else)."""

    def forward(self, input):
        return input

    def input_spatial_size(self, out_size):
        return out_size
