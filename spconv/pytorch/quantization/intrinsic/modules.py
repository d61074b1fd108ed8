"""Fused float modules that the FX fuser builds from conv / bn / relu (/ add) patterns (spconv 2.x:
``quantization.intrinsic``). They still compute in float: prepare turns them into observed or QAT modules,
convert into the int8 ones."""
import torch.ao.nn.intrinsic as nni
from torch.nn import BatchNorm1d, ReLU

from spconv.pytorch._symsize import maybe_nonzero
from spconv.pytorch.conv import SparseConvolution
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.modules import is_spconv_module


def _check(mods, kinds, what):
    if not all(isinstance(m, k) for m, k in zip(mods, kinds)):
        raise TypeError(f"{what} takes {', '.join(k.__name__ for k in kinds)}, got "
                        f"{', '.join(type(m).__name__ for m in mods)}")


class _FusedSparseModule(nni._FusedModule):
    """Runs its children in order; dense children (bn, relu) act on the features of a SparseConvTensor."""

    def forward(self, input):
        for module in self._modules.values():
            if is_spconv_module(module) or not isinstance(input, SparseConvTensor):
                input = module(input)
            elif maybe_nonzero(input.indices.shape[0]):
                input = input.replace_feature(module(input.features))
        return input


class SpconvReLUNd(_FusedSparseModule):
    """conv -> relu."""

    def __init__(self, conv, relu):
        _check((conv, relu), (SparseConvolution, ReLU), "SpconvReLUNd")
        super().__init__(conv, relu)


class SpconvBnNd(_FusedSparseModule):
    """conv -> batch norm."""

    def __init__(self, conv, bn):
        _check((conv, bn), (SparseConvolution, BatchNorm1d), "SpconvBnNd")
        super().__init__(conv, bn)


class SpconvBnReLUNd(_FusedSparseModule):
    """conv -> batch norm -> relu."""

    def __init__(self, conv, bn, relu):
        _check((conv, bn, relu), (SparseConvolution, BatchNorm1d, ReLU), "SpconvBnReLUNd")
        super().__init__(conv, bn, relu)


class SpconvBnAddReLUNd(_FusedSparseModule):
    """relu(bn(conv(x)) + residual): a residual block's last conv."""

    def __init__(self, conv, bn, relu):
        _check((conv, bn, relu), (SparseConvolution, BatchNorm1d, ReLU), "SpconvBnAddReLUNd")
        super().__init__(conv, bn, relu)

    def forward(self, input, add_input):
        conv, bn, relu = self[0], self[1], self[2]
        out = conv(input)
        out = out.replace_feature(bn(out.features))
        return out.replace_feature(relu(out.features + add_input.features))


class SpconvAddReLUNd(_FusedSparseModule):
    """relu(conv(x) + residual)."""

    def __init__(self, conv, relu):
        _check((conv, relu), (SparseConvolution, ReLU), "SpconvAddReLUNd")
        super().__init__(conv, relu)

    def forward(self, input, add_input):
        out = self[0](input)
        return out.replace_feature(self[1](out.features + add_input.features))
