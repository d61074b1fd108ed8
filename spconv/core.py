"""Enums shared across the package (spconv 2.x: ``spconv.core``)."""
import enum


class ConvAlgo(enum.Enum):
    """Kernel-map layout requested by a layer.

    ``Native`` keeps per-offset (input, output) pairs; ``MaskImplicitGemm`` and ``MaskSplitImplicitGemm``
    additionally build the output-stationary neighbour table the fused GPU route uses. Every algo gives the
    same numbers; on the CPU all of them run the native route.
    """

    Native = 0
    MaskImplicitGemm = 1
    MaskSplitImplicitGemm = 2


class Activation(enum.Enum):
    """Fused activations (spconv 2.x takes cumm's ``tv.gemm.Activation``; either is accepted by name)."""

    None_ = 0
    ReLU = 1
    Sigmoid = 2
    LeakyReLU = 3


class AlgoHint(enum.Enum):
    """Which GEMM a tuned kernel serves (spconv 2.x; the misspelt ``Fowrard`` is spconv's name)."""

    NoHint = 0b000
    Fowrard = 0b001
    BackwardInput = 0b010
    BackwardWeight = 0b100
