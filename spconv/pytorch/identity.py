"""``spconv.pytorch.identity`` (spconv 2.x): a sparse module that returns its input."""
from spconv.pytorch.modules import SparseModule


class Identity(SparseModule):
    """Returns its input unchanged (a SparseConvTensor, a list of them, or anything else)."""

    def forward(self, input):
        return input
