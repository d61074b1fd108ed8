from .conv_relu import LinearPerChannelWeightReLU, SparseConvAddReLU, SparseConvReLU  # noqa: F401
