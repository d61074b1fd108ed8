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


def is_spconv_module(module: nn.Module) -> bool:
    return isinstance(module, SparseModule)


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
