"""Module base classes and the sparse container (spconv 2.x: ``spconv.pytorch.modules``)."""
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from spconv.pytorch.core import SparseConvTensor


class SparseModule(nn.Module):
    """Base of every module that takes and returns a SparseConvTensor."""

    def __init__(self, name: Optional[str] = None):
        super().__init__()
        self._sparse_unique_name = "" if name is None else name

    @property
    def name(self) -> Optional[str]:
        return self._sparse_unique_name or None

    @name.setter
    def name(self, value: Optional[str]):
        self._sparse_unique_name = "" if value is None else value


def is_spconv_module(module: nn.Module) -> bool:
    """Modules that take the SparseConvTensor itself inside SparseSequential (dense ones get ``.features``)."""
    return isinstance(module, (SparseModule, SparseBatchNorm, SparseSyncBatchNorm, SparseReLU, SparseIdentity))


def is_sparse_conv(module: nn.Module) -> bool:
    from spconv.pytorch.conv import SparseConvolution
    return isinstance(module, SparseConvolution)


class SparseSequential(SparseModule):
    """Sequential container: sparse modules get the SparseConvTensor, dense modules (BatchNorm1d, ReLU, ...)
    get its ``.features``. As in spconv, dense modules are skipped for a tensor with no active sites."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        if len(args) == 1 and isinstance(args[0], OrderedDict):
            for key, module in args[0].items():
                self.add_module(key, module)
        else:
            for idx, module in enumerate(args):
                self.add_module(str(idx), module)
        for name, module in kwargs.items():
            if name in self._modules:
                raise ValueError(f"name {name!r} already exists")
            self.add_module(name, module)

    def __getitem__(self, idx):
        if isinstance(idx, slice):
            return self.__class__(OrderedDict(list(self._modules.items())[idx]))
        n = len(self._modules)
        if not -n <= idx < n:
            raise IndexError(f"index {idx} is out of range")
        if idx < 0:
            idx += n
        return list(self._modules.values())[idx]

    def __len__(self):
        return len(self._modules)

    def add(self, module: nn.Module, name: Optional[str] = None):
        if name is None:
            name = str(len(self._modules))
            if name in self._modules:
                raise KeyError("name exists")
        self.add_module(name, module)

    def forward(self, input):
        for module in self._modules.values():
            if is_spconv_module(module):
                input = module(input)
            elif isinstance(input, SparseConvTensor):
                if input.indices.shape[0] != 0:
                    input = input.replace_feature(module(input.features))
            else:
                input = module(input)
        return input


def assign_name_for_sparse_modules(module: nn.Module):
    """Names every sparse submodule by its path in ``module`` (spconv's benchmark records use the names)."""
    for name, child in module.named_modules():
        if isinstance(child, SparseModule):
            child._sparse_unique_name = name


class _FeatureWise:
    """Mixin for dense modules that also accept a SparseConvTensor: applied to ``.features``.

    They exist (as in spconv 2.x) so torch.fx-based tools see a sparse-aware module. A tensor with no active
    sites passes through unchanged, as SparseSequential does for dense modules (BatchNorm can't run on 0 rows).
    """

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            if input.features.shape[0] == 0:
                return input
            return input.replace_feature(super().forward(input.features))
        return super().forward(input)


class SparseBatchNorm(_FeatureWise, nn.BatchNorm1d):
    pass


class SparseSyncBatchNorm(_FeatureWise, nn.SyncBatchNorm):
    pass


class SparseReLU(_FeatureWise, nn.ReLU):
    pass


class SparseIdentity(_FeatureWise, nn.Identity):
    pass


class ToDense(SparseModule):
    """SparseConvTensor -> dense ``[B, C, *spatial]`` (channels first)."""

    def forward(self, x: SparseConvTensor) -> torch.Tensor:
        if not isinstance(x, SparseConvTensor):
            raise TypeError(f"ToDense expects a SparseConvTensor, got {type(x).__name__}")
        return x.dense()


class RemoveGrid(SparseModule):
    """Drops the tensor's pre-allocated grid buffer (spconv 1.x); returns the same tensor."""

    def forward(self, x: SparseConvTensor) -> SparseConvTensor:
        x.grid = None
        return x
