"""Module base classes and the sparse container (spconv 2.x: ``spconv.pytorch.modules``)."""
import sys
import time
from collections import OrderedDict
from typing import Optional

import torch
from torch import nn

from spconv.pytorch._symsize import maybe_nonzero, surely_zero
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


def _traceable_eval_batch_norm(module: nn.Module, x: torch.Tensor):
    """Eval-mode batch norm of ``x`` through the op it lowers to, while tracing; None otherwise.

    torch's batch_norm guards on ``numel() == 0``, which stops torch.export on a data-dependent row count
    (every layer after a regular conv); the eval-mode op itself traces, and eager mode gives the same bits.
    """
    if not torch.compiler.is_compiling() or module.training or x.dim() != 2:
        return None
    if not isinstance(module, nn.modules.batchnorm._BatchNorm) or module.running_mean is None:
        return None
    return torch.ops.aten._native_batch_norm_legit_no_training(x, module.weight, module.bias, module.running_mean,
                                                                module.running_var, 0.0, module.eps)[0]


def apply_dense(module: nn.Module, features: torch.Tensor) -> torch.Tensor:
    """A dense (row-wise) module on a SparseConvTensor's features."""
    out = _traceable_eval_batch_norm(module, features)
    return module(features) if out is None else out


def is_spconv_module(module: nn.Module) -> bool:
    """Modules that take the SparseConvTensor itself inside SparseSequential (dense ones get ``.features``)."""
    return (isinstance(module, (SparseModule, SparseBatchNorm, SparseSyncBatchNorm, SparseReLU, SparseIdentity))
            or getattr(module, "takes_sparse_tensor", False))


def is_sparse_conv(module: nn.Module) -> bool:
    """Whether ``module`` is a SparseConvolution (looked up without importing the convs: this module is below
    them, and no module can be a conv before spconv.pytorch.conv is imported)."""
    conv = sys.modules.get("spconv.pytorch.conv")
    return conv is not None and isinstance(module, conv.SparseConvolution)


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
                if maybe_nonzero(input.indices.shape[0]):
                    input = input.replace_feature(apply_dense(module, input.features))
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
            if surely_zero(input.features.shape[0]):
                return input
            out = _traceable_eval_batch_norm(self, input.features)
            return input.replace_feature(super().forward(input.features) if out is None else out)
        return super().forward(input)


class SparseBatchNorm(_FeatureWise, nn.BatchNorm1d):
    pass


class SparseSyncBatchNorm(nn.modules.batchnorm._BatchNorm):
    """BatchNorm whose training statistics span every process of ``process_group`` (default: WORLD).

    spconv 2.x's constructor, parameters and state_dict (same keys as ``nn.SyncBatchNorm``), but it runs on CPU
    (gloo) as well as GPU (nccl/rccl): torch's ``nn.SyncBatchNorm`` is GPU-only and DistributedDataParallel
    refuses its subclasses in CPU modules, so this derives from ``_BatchNorm`` (``isinstance(m,
    nn.SyncBatchNorm)`` is False) and reduces the statistics itself (``spconv.pytorch.sync_batchnorm``).
    Takes a SparseConvTensor (normalizes ``.features``) or a dense ``[N, C, *]`` tensor. In training mode with
    more than one process every rank joins the collectives, also with no active sites (it then contributes
    nothing and returns the empty tensor); otherwise it is plain batch norm, and an empty tensor passes through.
    """

    def __init__(self, num_features: int, eps: float = 1e-5, momentum: Optional[float] = 0.1, affine: bool = True,
                 track_running_stats: bool = True, process_group=None, device=None, dtype=None, *, bias: bool = True):
        # bias=False needs a torch whose batch norm takes it (as nn.SyncBatchNorm's signature does there).
        extra = {} if bias else {"bias": False}
        super().__init__(num_features, eps, momentum, affine, track_running_stats, device=device, dtype=dtype,
                         **extra)
        self.process_group = process_group

    def _check_input_dim(self, input):
        if input.dim() < 2:
            raise ValueError(f"expected at least 2D input (got {input.dim()}D input)")

    def _sync_group(self):
        """The process group to reduce over in this call, or None for plain batch norm."""
        if not (self.training and torch.distributed.is_available() and torch.distributed.is_initialized()):
            return None
        group = self.process_group if self.process_group is not None else torch.distributed.group.WORLD
        return group if torch.distributed.get_world_size(group) > 1 else None

    def _normalize(self, x: torch.Tensor) -> torch.Tensor:
        self._check_input_dim(x)
        if x.shape[1] != self.num_features:
            raise ValueError(f"expected {self.num_features} channels, got {x.shape[1]}")
        group = self._sync_group()
        if group is None and surely_zero(x.numel()):
            return x  # as SparseSequential does for dense modules: BatchNorm can't run on 0 rows
        traced = _traceable_eval_batch_norm(self, x)
        if traced is not None:
            return traced
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats:
            self.num_batches_tracked.add_(1)
            if self.momentum is None:  # cumulative moving average
                factor = 1.0 / float(self.num_batches_tracked.item())
        bn_training = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        running_mean = self.running_mean if track else None
        running_var = self.running_var if track else None
        if group is None:
            return nn.functional.batch_norm(x, running_mean, running_var, self.weight, self.bias, bn_training,
                                            factor, self.eps)
        from spconv.pytorch.sync_batchnorm import sync_batch_norm
        return sync_batch_norm(x, self.weight, self.bias, running_mean, running_var, self.eps, factor, group)

    def forward(self, input):
        if isinstance(input, SparseConvTensor):
            return input.replace_feature(self._normalize(input.features))
        return self._normalize(input)

    @classmethod
    def convert_sync_batchnorm(cls, module: nn.Module, process_group=None) -> nn.Module:
        """Replaces every BatchNorm (``_BatchNorm``: BatchNorm1d/2d/3d, SparseBatchNorm, nn.SyncBatchNorm) in
        ``module`` with a SparseSyncBatchNorm carrying its parameters and running statistics."""
        out = module
        if isinstance(module, nn.modules.batchnorm._BatchNorm) and not isinstance(module, cls):
            out = cls(module.num_features, module.eps, module.momentum, module.affine, module.track_running_stats,
                      process_group)
            if module.affine:
                with torch.no_grad():
                    out.weight = module.weight
                    out.bias = module.bias
            out.running_mean = module.running_mean
            out.running_var = module.running_var
            out.num_batches_tracked = module.num_batches_tracked
            out.training = module.training
            if hasattr(module, "qconfig"):
                out.qconfig = module.qconfig
        for name, child in module.named_children():
            out.add_module(name, cls.convert_sync_batchnorm(child, process_group))
        return out


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


class PrintTensorMeta(nn.Module):
    """Prints min, max and mean of a tensor's (or a SparseConvTensor's) features; returns the input (debugging)."""

    def forward(self, x):
        t = x.features if isinstance(x, SparseConvTensor) else x
        if t.is_quantized:
            t = t.dequantize()
        print(t.min(), t.max(), t.float().mean())
        return x


class PrintCurrentTime(nn.Module):
    """Prints the seconds since construction (or the last ``reset``), after the device finishes; returns x."""

    def __init__(self) -> None:
        super().__init__()
        self.first_time = time.time()

    def forward(self, x, msg: str = "", reset: bool = False):
        if reset:
            self.first_time = time.time()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        print(msg, time.time() - self.first_time)
        return x
