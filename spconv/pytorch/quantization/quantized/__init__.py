from .conv import LinearPerChannelWeight, SparseConv  # noqa: F401
