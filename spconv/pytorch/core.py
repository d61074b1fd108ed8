"""SparseConvTensor and the kernel-map records stored in its ``indice_dict`` (spconv 2.x: ``spconv.pytorch.core``)."""
import math
from typing import Any, Dict, List, Optional, Union

import numpy as np
import torch
import torch.fx
import torch.fx._symbolic_trace as _fx_trace

from spconv.core import ConvAlgo
from spconv.pytorch._qview import as_qint8, int_view
# The kernel-map records live on the ground floor (_maps); spconv 2.x code and pickles find them here too.
from spconv.pytorch._maps import (MAP_MIRRORED, MAP_REPEAT_FREE, PairMaps, identity_map,  # noqa: F401
                                  make_map_info, map_info_input, map_info_of, pairs_to_spconv_layout)
from spconv.pytorch._symsize import check_equal, surely_zero


def expand_nd(ndim: int, val: Union[int, List[int], tuple], name: str = "value") -> List[int]:
    """An int or a sequence of ``ndim`` ints -> a list of ``ndim`` ints."""
    if isinstance(val, (int, np.integer)):
        return [int(val)] * ndim
    val = [int(v) for v in val]
    if len(val) != ndim:
        raise ValueError(f"{name} must be an int or have {ndim} entries, got {val}")
    return val


class IndiceData:
    """A layer's kernel map, stored under its ``indice_key`` (same fields as spconv 2.x)."""

    def __init__(self, out_indices: torch.Tensor, indices: torch.Tensor, maps: PairMaps, spatial_shape: List[int],
                 out_spatial_shape: List[int], is_subm: bool, algo: ConvAlgo, ksize: List[int], stride: List[int],
                 dilation: List[int], padding: List[int], voxel_num: Optional[Any] = None):
        self.out_indices = out_indices
        self.indices = indices
        self.maps = maps
        self.spatial_shape = list(spatial_shape)
        self.out_spatial_shape = list(out_spatial_shape)
        self.is_subm = is_subm
        self.algo = algo
        self.ksize = list(ksize)
        self.stride = list(stride)
        self.dilation = list(dilation)
        self.padding = list(padding)
        self.voxel_num = voxel_num

    @property
    def indice_pair_num(self) -> torch.Tensor:
        """Pairs per kernel offset, int32 [kvol] (spconv 2.x layout)."""
        return self.maps.pair_counts().int()

    @property
    def indice_pairs(self) -> torch.Tensor:
        """spconv 2.x layout: int32 [2, kvol, num_in], row 0 inputs, row 1 outputs, -1 padded."""
        return pairs_to_spconv_layout(self.maps, self.maps.num_in)


# spconv 2.x has a second record type for its implicit-GEMM kernel maps; here one record serves every algo.
ImplicitGemmIndiceData = IndiceData


def _row_major_index(coords: torch.Tensor, shape: List[int]) -> torch.Tensor:
    """The position of each row of ``coords`` ([N, len(shape)]) in a row-major grid of ``shape``: long [N]."""
    strides = torch.tensor([math.prod(shape[i + 1:]) for i in range(len(shape))], dtype=torch.long,
                           device=coords.device)
    return (coords.long() * strides).sum(-1)  # [0] for no rows, without a branch on the row count


def scatter_nd(indices: torch.Tensor, updates: torch.Tensor, shape: List[int]) -> torch.Tensor:
    """Dense tensor of ``shape`` with ``updates`` written at ``indices`` (rows of leading coordinates)."""
    ret = torch.zeros(*shape, dtype=updates.dtype, device=updates.device)
    ndim = indices.shape[-1]
    lin = _row_major_index(indices.reshape(-1, ndim), shape[:ndim])
    ret.view(-1, *shape[ndim:])[lin] = updates.reshape(-1, *shape[ndim:])
    return ret


def scatter_nd_channels_first(indices: torch.Tensor, updates: torch.Tensor, batch_size: int,
                              spatial_shape: List[int]) -> torch.Tensor:
    """``[B, C, *spatial]``, zero but for row ``r`` of ``updates`` at ``(indices[r, 0], :, *indices[r, 1:])``.
    Written in place: a channels-last tensor and its permuted copy cost about 5x as much on the CPU (the copy
    walks the big tensor with a stride of C). The write goes into the base tensor, not a view of it, so that the
    backward only gathers the gradient's rows (a view's would first copy the whole gradient). VoxelBackBone8x's
    82 MB BEV map, 2 threads: forward 135 -> 26 ms, forward+backward 196 -> 38 ms."""
    channels, sites = updates.shape[1], math.prod(spatial_shape)
    ret = torch.zeros(batch_size, channels, sites, dtype=updates.dtype, device=updates.device)
    ret[indices[:, 0].long(), :, _row_major_index(indices[:, 1:], spatial_shape)] = updates
    return ret.view(batch_size, channels, *spatial_shape)


def check_indices_in_grid(indices: torch.Tensor, spatial_shape: List[int], batch_size: int):
    """ValueError naming the first row with a batch index or coordinate outside ``[0, batch_size) x spatial_shape``."""
    if surely_zero(indices.shape[0]):
        return
    high = torch.tensor([batch_size] + list(spatial_shape), dtype=torch.long, device=indices.device)
    bad = ((indices < 0) | (indices.long() >= high)).any(1)
    if torch.compiler.is_compiling():  # a traced graph checks on the device (no Python bool of data)
        torch._assert_async(~bad.any(), "indices outside batch_size x spatial_shape")
        return
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(f"indices row {row} = {indices[row].tolist()} is outside batch_size={batch_size} x "
                         f"spatial_shape {list(spatial_shape)}")


def check_unique_indices(indices: torch.Tensor):
    """ValueError naming two rows of ``indices`` that hold the same (batch, coordinate)."""
    if indices.shape[0] < 2:
        return
    order = torch.arange(indices.shape[0], device=indices.device)
    for col in reversed(range(indices.shape[1])):  # lexicographic sort by stable passes, no key overflow
        order = order[torch.sort(indices[order, col], stable=True).indices]
    rows = indices[order]
    same = (rows[1:] == rows[:-1]).all(1)
    if bool(same.any()):
        pos = int(same.nonzero()[0, 0])
        a, b = sorted((int(order[pos]), int(order[pos + 1])))
        raise ValueError(f"indices rows {a} and {b} hold the same coordinate {indices[a].tolist()}; this layer "
                         "needs unique coordinates (spconv.constants.SPCONV_CHECK_DUPLICATES is on)")


class _TraceableMeta(type):
    """Constructed from ``torch.fx`` proxies, the class records one graph node instead of running ``__init__``
    (torch.fx.ProxyableClassMeta's behaviour, without its query of the tracing state on every construction)."""

    def __call__(cls, *args, **kwargs):
        if not getattr(_fx_trace, "_is_fx_tracing_flag", True):  # no symbolic trace running: no proxy to find
            return super().__call__(*args, **kwargs)
        found = []
        torch.fx.node.map_aggregate((args, kwargs),
                                    lambda a: found.append(a) if isinstance(a, torch.fx.Proxy) else None)
        if found:
            return found[0].tracer.create_proxy("call_function", cls, args, kwargs)
        return super().__call__(*args, **kwargs)


class SparseConvTensor(metaclass=_TraceableMeta):
    """Sparse features ``[N, C]`` at int32 ``indices [N, 1 + ndim]`` (batch first) on a grid ``spatial_shape``.

    Constructed from ``torch.fx`` proxies (a model's ``forward`` being traced for quantization), it becomes one
    node of the graph, as in spconv 2.x."""

    def __init__(self, features: torch.Tensor, indices: torch.Tensor, spatial_shape: Union[List[int], np.ndarray],
                 batch_size: int, grid: Optional[torch.Tensor] = None, voxel_num: Optional[torch.Tensor] = None,
                 indice_dict: Optional[Dict[str, IndiceData]] = None, benchmark: bool = False,
                 permanent_thrust_allocator: bool = False, enable_timer: bool = False,
                 force_algo: Optional[ConvAlgo] = None):
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise ValueError(f"features must be a 2-D tensor [N, C], got "
                             f"{tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)}")
        if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
            raise ValueError("indices must be a 2-D int32 tensor [N, 1 + ndim]")
        if indices.dtype != torch.int32:
            raise TypeError(f"indices must be int32 (spconv layout), got {indices.dtype}")
        ndim = indices.shape[1] - 1
        spatial_shape = [int(v) for v in spatial_shape]
        if len(spatial_shape) != ndim:
            raise ValueError(f"spatial_shape has {len(spatial_shape)} entries but indices have {ndim} coordinates")
        # Rows and devices are checked where the tensor is consumed (check_consistent), not here: as in spconv 2.x,
        # features and indices may disagree between two statements (replace_feature, then `x.indices = ...`).
        if int(batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self._features = features
        self.indices = indices
        self.spatial_shape = spatial_shape
        self.batch_size = int(batch_size)
        self.indice_dict: Dict[str, IndiceData] = {} if indice_dict is None else indice_dict
        self.grid = torch.Tensor() if grid is None else grid
        self.voxel_num = voxel_num
        self.benchmark = benchmark
        self.benchmark_record: Dict[str, Any] = {}
        self.thrust_allocator = None  # spconv 2.x GPU sort allocator; kept for compatibility
        self.enable_timer = enable_timer
        self._timer = None
        self.force_algo = force_algo
        self.int8_scale = None

    _consistent = None  # what check_consistent last passed (see there); not pickled

    def __getstate__(self):
        state = dict(self.__dict__)
        state.pop("_consistent", None)
        return state

    def check_consistent(self, who: str) -> None:
        """ValueError (TypeError for a dtype) naming ``who`` unless features and indices can be consumed together:
        a 2-D features tensor, int32 ``indices [N, 1 + ndim]`` with as many rows, on the same device, and
        ``spatial_shape`` of ndim entries. Layers, ``dense()`` and the ops call it on their input, so that the
        tensor may be edited in place or rebuilt piecewise between two layers, as spconv 2.x allows. A tensor that
        passed keeps the features, indices and shape it passed with (``_consistent``): while those are the same
        objects, with the same sizes, it passes again without the checks."""
        features, indices = self._features, self.indices
        seen = self._consistent
        if seen is not None and not torch.compiler.is_compiling() and seen[0] is features and seen[1] is indices \
                and seen[2] is self.spatial_shape and seen[3] == self._sizes():
            return
        if not isinstance(features, torch.Tensor) or features.dim() != 2:
            raise ValueError(f"{who}: features must be a 2-D tensor [N, C], got "
                             f"{tuple(features.shape) if isinstance(features, torch.Tensor) else type(features)}")
        if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
            raise ValueError(f"{who}: indices must be a 2-D int32 tensor [N, 1 + ndim], got "
                             f"{tuple(indices.shape) if isinstance(indices, torch.Tensor) else type(indices)}")
        if indices.dtype != torch.int32:
            raise TypeError(f"{who}: indices must be int32 (spconv layout), got {indices.dtype}")
        if len(self.spatial_shape) != indices.shape[1] - 1:
            raise ValueError(f"{who}: spatial_shape {list(self.spatial_shape)} has {len(self.spatial_shape)} entries "
                             f"but indices have {indices.shape[1] - 1} coordinates")
        check_equal(features.shape[0], indices.shape[0],  # the message names the sizes
                    f"{who}: features and indices must have the same number of rows")
        if features.device != indices.device:
            raise ValueError(f"{who}: features are on {features.device} but indices on {indices.device}")
        if not torch.compiler.is_compiling():
            self._consistent = (features, indices, self.spatial_shape, self._sizes())

    def _sizes(self):
        f, i = self._features, self.indices
        return f.shape, i.shape, i.dtype, f.device, i.device, len(self.spatial_shape)

    def __repr__(self):
        return (f"SparseConvTensor[shape={tuple(self._features.shape)}, spatial_shape={self.spatial_shape}, "
                f"batch_size={self.batch_size}, dtype={self._features.dtype}, device={self._features.device}]")

    @property
    def features(self) -> torch.Tensor:
        return self._features

    @features.setter
    def features(self, val):
        raise ValueError("you can't set features directly, use 'x = x.replace_feature(new_features)' "
                         "to make a new SparseConvTensor")

    @property
    def is_quantized(self) -> bool:
        return self._features.is_quantized

    def q_scale(self):
        if self.is_quantized:
            return self._features.q_scale()
        raise ValueError("sparse tensor must be quantized")

    def dequantize(self) -> "SparseConvTensor":
        """The float tensor of quantized features (spconv 2.x); a float tensor is returned as it is."""
        return self.replace_feature(self._features.dequantize()) if self.is_quantized else self

    def _copy_attrs_to(self, other: "SparseConvTensor") -> "SparseConvTensor":
        other.benchmark = self.benchmark
        other.benchmark_record = self.benchmark_record
        other.thrust_allocator = self.thrust_allocator
        other._timer = self._timer
        other.force_algo = self.force_algo
        other.int8_scale = self.int8_scale
        return other

    def replace_feature(self, feature: torch.Tensor) -> "SparseConvTensor":
        """A new tensor with ``feature`` and everything else (including ``indice_dict``) shared."""
        new = SparseConvTensor(feature, self.indices, self.spatial_shape, self.batch_size, self.grid, self.voxel_num,
                               self.indice_dict)
        return self._copy_attrs_to(new)

    def with_structure(self, features: torch.Tensor, indices: torch.Tensor, spatial_shape: List[int],
                       indice_dict: Dict[str, IndiceData]) -> "SparseConvTensor":
        """A layer's output: new features on new coordinates, the other attributes carried over."""
        new = SparseConvTensor(features, indices, spatial_shape, self.batch_size, self.grid, self.voxel_num,
                               indice_dict)
        return self._copy_attrs_to(new)

    def shadow_copy(self) -> "SparseConvTensor":
        """A new tensor object with every member shared (spconv 2.x semantics)."""
        new = SparseConvTensor(self._features, self.indices, self.spatial_shape, self.batch_size, self.grid,
                               self.voxel_num, self.indice_dict, self.benchmark)
        return self._copy_attrs_to(new)

    def minus(self) -> "SparseConvTensor":
        return self.replace_feature(-self._features)

    def __neg__(self):
        return self.minus()

    def __add__(self, other: Union["SparseConvTensor", torch.Tensor]) -> "SparseConvTensor":
        """Feature-wise sum; both operands must share coordinates (use functional.sparse_add otherwise)."""
        if isinstance(other, SparseConvTensor):
            if other.indices.shape != self.indices.shape:
                raise ValueError("__add__ needs the same coordinates; use spconv.pytorch.functional.sparse_add "
                                 "for tensors with different coordinate sets")
            other = other.features
        if not isinstance(other, torch.Tensor):
            return NotImplemented
        return self.replace_feature(self._features + other)

    def __radd__(self, other):
        return self.__add__(other)

    def __iadd__(self, other):
        return self.__add__(other)

    @classmethod
    def from_dense(cls, x: torch.Tensor) -> "SparseConvTensor":
        """From a channels-last dense tensor ``[B, *spatial, C]``; sites whose channels are all zero are dropped."""
        if x.dim() < 3:
            raise ValueError(f"x must be [B, *spatial, C], got {tuple(x.shape)}")
        active = (x != 0).any(dim=-1)
        coords = active.nonzero()
        features = x[tuple(coords.t())]
        return cls(features, coords.int(), list(x.shape[1:-1]), x.shape[0])

    @property
    def spatial_size(self) -> int:
        return int(np.prod(self.spatial_shape))

    def find_indice_pair(self, key) -> Optional[IndiceData]:
        if key is None:
            return None
        return self.indice_dict.get(key)

    def dense(self, channels_first: bool = True) -> torch.Tensor:
        """``[B, C, *spatial]`` (or ``[B, *spatial, C]``); inactive sites are zero."""
        self.check_consistent("dense()")
        check_indices_in_grid(self.indices, self.spatial_shape, self.batch_size)  # else rows would wrap silently
        indices = self.indices.to(self._features.device).long()
        values = self._features
        if self.is_quantized:  # scatter the int8 values; the dense tensor keeps the features' scale
            values = int_view(self._features)
        if channels_first:
            res = scatter_nd_channels_first(indices, values, self.batch_size, self.spatial_shape)
        else:
            res = scatter_nd(indices, values, [self.batch_size] + self.spatial_shape + [values.shape[1]])
        return as_qint8(res, self._features.q_scale()) if self.is_quantized else res
