"""Sparse pooling layers (spconv 2.x: ``spconv.pytorch.pool``).

Semantics kept from spconv because models depend on them:

* Max pool outputs start at 0: an output is ``max(0, max over the window's active inputs)``, so a window whose
  active inputs are all negative gives 0 (a dense max pool over the densified tensor agrees whenever the window
  holds an inactive site or a positive value). The gradient goes to the input that holds the maximum; among equal
  inputs, to the first in window raster order (as ``torch.nn.functional.max_pool``); none flows when the output
  is the clamp's 0.
* Avg pool divides by the number of *active* inputs in the window, not by the kernel volume.
* A pooling layer with an ``indice_key`` stores its kernel map like a regular conv, so a ``SparseInverseConv``
  with that key restores the pre-pool coordinates.
* ``SparseGlobalMaxPool`` / ``SparseGlobalAvgPool`` return a dense ``[batch_size, C]`` tensor; the max is the
  plain max (no clamp at 0).

Differences from spconv 2.3.8 (bugs there, fixed here): ``SparseGlobalAvgPool`` returns ``[batch_size, C]``
(spconv returns only channel 0 of each mean, ``[batch_size]``); a batch entry with no active site gives zeros
in both global pools (spconv raises or returns NaN).
"""
from typing import List, Optional, Tuple, Union

import numpy as np
import torch

from spconv.core import ConvAlgo
from spconv.pytorch import _checkpoint, _route, ops
from spconv.pytorch import functional as Fsp  # noqa: F401  (spconv 2.x names it so here)
# ImplicitGemmIndiceData: spconv 2.x code imports it from this module.
from spconv.pytorch.core import ImplicitGemmIndiceData, IndiceData, SparseConvTensor, expand_nd  # noqa: F401
from spconv.pytorch.modules import SparseModule

IntOrSeq = Union[int, List[int], Tuple[int, ...]]

# Buffer name spconv 2.x uses for record_voxel_count (kept so such checkpoints load).
_MAX_NUM_VOXELS_DURING_TRAINING = "max_num_voxels_during_training"
# spconv 2.x's max pools default to implicit GEMM up to this kernel volume, Native above.
_IMPLICIT_GEMM_MAX_KV = 128


class _SparsePoolBase(SparseModule):
    """Shared geometry, kernel-map construction and indice_key bookkeeping of max and avg pools."""

    _KIND = ""

    def __init__(self, ndim: int, kernel_size: IntOrSeq = 3, stride: Optional[IntOrSeq] = 1, padding: IntOrSeq = 0,
                 dilation: IntOrSeq = 1, indice_key: Optional[str] = None, subm: bool = False,
                 algo: Optional[ConvAlgo] = None, record_voxel_count: bool = False, name: Optional[str] = None):
        super().__init__(name=name)
        if not 1 <= ndim <= 4:
            raise ValueError(f"ndim must be 1..4, got {ndim}")
        self.ndim = ndim
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = list(self.kernel_size) if stride is None else expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        for name_, vals, low in (("kernel_size", self.kernel_size, 1), ("stride", self.stride, 1),
                                 ("dilation", self.dilation, 1), ("padding", self.padding, 0)):
            if any(v < low for v in vals):
                raise ValueError(f"{name_} entries must be >= {low}, got {vals}")
        if subm and any(s != 1 for s in self.stride):
            raise ValueError(f"a submanifold pool needs stride 1, got {self.stride}")
        self.subm = subm
        self.indice_key = indice_key
        # Every algo gives the same numbers here; the value is kept (and stored with the kernel map) because an
        # inverse conv reusing this layer's indice_key reads it. Defaults as spconv 2.x's GPU build.
        if algo is not None and not isinstance(algo, ConvAlgo):
            raise TypeError(f"algo must be a spconv.core.ConvAlgo or None, got {algo!r}")
        self.algo = self._default_algo(int(np.prod(self.kernel_size))) if algo is None else algo
        self.record_voxel_count = record_voxel_count
        if record_voxel_count and not subm:
            self.register_buffer(_MAX_NUM_VOXELS_DURING_TRAINING, torch.zeros(1, dtype=torch.int32))
        self._register_load_state_dict_pre_hook(_checkpoint.load_pre_hook, with_module=True)

    @staticmethod
    def _default_algo(kv: int) -> ConvAlgo:
        return ConvAlgo.MaskImplicitGemm if kv <= _IMPLICIT_GEMM_MAX_KV else ConvAlgo.Native

    def extra_repr(self):
        # spconv 2.x's text: padding and dilation are always printed.
        return (f"kernel_size={self.kernel_size}, stride={self.stride}, padding={self.padding}, "
                f"dilation={self.dilation}, algo={self.algo}")

    def get_max_num_voxels(self) -> Optional[torch.Tensor]:
        return getattr(self, _MAX_NUM_VOXELS_DURING_TRAINING, None)

    def _pool_features(self, features: torch.Tensor, maps, num_out: int) -> torch.Tensor:
        raise NotImplementedError

    def forward(self, input: SparseConvTensor) -> SparseConvTensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor, got {type(input).__name__}")
        input.check_consistent(type(self).__name__)
        if len(input.spatial_shape) != self.ndim:
            raise ValueError(f"{type(self).__name__} is {self.ndim}-D but the input's spatial_shape is "
                             f"{input.spatial_shape}")
        spatial_shape = input.spatial_shape
        if self.subm:
            out_spatial_shape = list(spatial_shape)
        else:
            out_spatial_shape = ops.get_conv_output_size(spatial_shape, self.kernel_size, self.stride, self.padding,
                                                         self.dilation)
        indice_dict = input.indice_dict.copy()
        if self.indice_key is not None and self.indice_key in indice_dict:
            raise ValueError(f"indice_key {self.indice_key!r} already exists in this tensor; a pooling layer "
                             "needs a new key")
        outids, maps = ops.build_kernel_map(input.indices, input.batch_size, spatial_shape, out_spatial_shape,
                                            self.kernel_size, self.stride, self.padding, self.dilation, self.subm,
                                            False)
        if self.indice_key is not None:
            indice_dict[self.indice_key] = IndiceData(
                outids, input.indices, maps, spatial_shape, out_spatial_shape, is_subm=self.subm, algo=self.algo,
                ksize=self.kernel_size, stride=self.stride, dilation=self.dilation, padding=self.padding)
        counter = self.get_max_num_voxels()
        if counter is not None:  # spconv 2.x records in training and inference alike
            ops.maximum_value_int_(counter, outids.shape[0])
        out = self._pool_features(input.features, maps.to(input.features.device), outids.shape[0])
        return input.with_structure(out, outids, out_spatial_shape, indice_dict)


class SparseMaxPool(_SparsePoolBase):
    """Max pool: ``max(0, max of the window's active inputs)`` (spconv's semantics, see the module docstring)."""

    def _pool_features(self, features, maps, num_out):
        if features.is_quantized:  # integer max on the int8 values, the input's scale kept (shared observer)
            return _route.int8_maxpool(features, maps, num_out)
        return ops.indice_maxpool_native(features, maps, num_out)


class SparseAvgPool(_SparsePoolBase):
    """Avg pool: the mean over the window's active inputs (divides by their count, not the kernel volume).

    Its ``algo`` is always ``MaskImplicitGemm``, whatever is passed, as in spconv 2.x.
    """

    def __init__(self, ndim: int, kernel_size: IntOrSeq = 3, stride: Optional[IntOrSeq] = 1, padding: IntOrSeq = 0,
                 dilation: IntOrSeq = 1, indice_key: Optional[str] = None, subm: bool = False,
                 algo: Optional[ConvAlgo] = None, record_voxel_count: bool = False, name: Optional[str] = None):
        super().__init__(ndim, kernel_size, stride, padding, dilation, indice_key, subm, algo, record_voxel_count,
                         name)
        self.algo = ConvAlgo.MaskImplicitGemm

    def _pool_features(self, features, maps, num_out):
        if features.is_quantized:
            raise NotImplementedError(f"{type(self).__name__}: int8 average pooling is not supported (as in spconv "
                                      "2.x); leave this layer in float (qconfig None)")
        return ops.indice_avgpool_native(features, maps, num_out)[0]


def _pool_nd(base, ndim: int, doc: str):
    class _Pool(base):
        __doc__ = doc

        def __init__(self, kernel_size, stride=None, padding=0, dilation=1, indice_key=None,
                     algo: Optional[ConvAlgo] = None, record_voxel_count: bool = False, name=None):
            super().__init__(ndim, kernel_size, stride, padding, dilation, indice_key=indice_key, algo=algo,
                             record_voxel_count=record_voxel_count, name=name)

    return _Pool


class SparseMaxPool1d(_pool_nd(SparseMaxPool, 1, SparseMaxPool.__doc__)):
    pass


class SparseMaxPool2d(_pool_nd(SparseMaxPool, 2, SparseMaxPool.__doc__)):
    pass


class SparseMaxPool3d(_pool_nd(SparseMaxPool, 3, SparseMaxPool.__doc__)):
    pass


class SparseMaxPool4d(_pool_nd(SparseMaxPool, 4, SparseMaxPool.__doc__)):
    pass


class SparseAvgPool1d(_pool_nd(SparseAvgPool, 1, SparseAvgPool.__doc__)):
    pass


class SparseAvgPool2d(_pool_nd(SparseAvgPool, 2, SparseAvgPool.__doc__)):
    pass


class SparseAvgPool3d(_pool_nd(SparseAvgPool, 3, SparseAvgPool.__doc__)):
    pass


class SparseGlobalMaxOrAvgPool(SparseModule):
    """Pools every batch entry to one vector: a dense ``[batch_size, C]`` tensor (zeros for an empty entry)."""

    def __init__(self, is_mean: bool, name: Optional[str] = None):
        super().__init__(name=name)
        self.is_mean = is_mean

    def forward(self, input: SparseConvTensor) -> torch.Tensor:
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor, got {type(input).__name__}")
        input.check_consistent(type(self).__name__)
        features = input.features
        batch = input.indices[:, 0].to(device=features.device, dtype=torch.long)
        out = features.new_zeros((input.batch_size, features.shape[1]))
        index = batch[:, None].expand_as(features)
        if self.is_mean:
            count = torch.bincount(batch, minlength=input.batch_size).clamp_(min=1).to(features.dtype)
            return out.scatter_add(0, index, features) / count[:, None]
        # include_self=False: an entry's result is the max of its own rows only; empty entries keep the 0.
        return out.scatter_reduce(0, index, features, reduce="amax", include_self=False)


class SparseGlobalMaxPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name: Optional[str] = None):
        super().__init__(is_mean=False, name=name)


class SparseGlobalAvgPool(SparseGlobalMaxOrAvgPool):
    def __init__(self, name: Optional[str] = None):
        super().__init__(is_mean=True, name=name)


ALL_POOL_LAYERS = {SparseMaxPool, SparseAvgPool, SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d, SparseMaxPool4d,
                   SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d}
