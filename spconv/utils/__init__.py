"""spconv 2.x ``spconv.utils``: the voxel generators OpenPCDet and others call directly.

``Point2VoxelCPU{1,2,3,4}d`` and ``Point2VoxelGPU{1,2,3,4}d`` take points as cumm tensorviews
(``tv.from_numpy(points)``), numpy arrays or torch tensors and return ``cumm.tensorview.Tensor`` objects, as spconv
does: ``.numpy()`` copies, ``.numpy_view()`` views, ``.shape`` is a list. ``cumm`` is the real one where installed,
else this package's stand-in (spconv/_cumm); GPU results are always the stand-in's torch-backed Tensor.
OpenPCDet's ``VoxelGeneratorWrapper`` runs unchanged::

    gen = Point2VoxelCPU3d(vsize_xyz=[0.05, 0.05, 0.1], coors_range_xyz=[0, -40, -3, 70.4, 40, 1],
                           num_point_features=4, max_num_voxels=16000, max_num_points_per_voxel=5)
    voxels, coords, num_points = gen.point_to_voxel(points)     # coords in zyx order
    voxels = voxels.numpy()

The 1.x-era names ``VoxelGenerator``/``VoxelGeneratorV2`` are deliberately absent, as in spconv 2.x: OpenPCDet
tries them first and would take its spconv 1.x branch.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np
import torch

from spconv.pytorch.utils import calc_point2voxel_meta_data, point_to_voxel_op

__all__ = ["Point2VoxelCPU1d", "Point2VoxelCPU2d", "Point2VoxelCPU3d", "Point2VoxelCPU4d",
           "Point2VoxelGPU1d", "Point2VoxelGPU2d", "Point2VoxelGPU3d", "Point2VoxelGPU4d"]


def _tensorview():
    """``cumm.tensorview`` as callers see it: the real one where installed, else this package's stand-in (also
    when an installed cumm fails to import)."""
    try:
        import cumm.tensorview as tv
    except ImportError:
        import spconv._cumm.shim.cumm.tensorview as tv
    return tv


def _shim_tensorview():
    """This package's stand-in module (GPU results need its torch-backed Tensor, also beside a real cumm)."""
    from spconv._cumm import is_shim
    tv = _tensorview()
    if is_shim(tv):
        return tv
    import spconv._cumm.shim.cumm.tensorview as shim
    return shim


def _to_tensorview(t: torch.Tensor):
    if t.device.type == "cpu":
        return _tensorview().from_numpy(t.numpy())
    return _shim_tensorview().Tensor(t)


def _is_tensorview(x) -> bool:
    # cumm's tv.Tensor or the stand-in (checked by interface, so either works).
    return hasattr(x, "numpy_view") and hasattr(x, "cpu") and isinstance(getattr(x, "device", None), int)


def _as_torch_points(points, device: torch.device) -> torch.Tensor:
    """numpy array, torch tensor or cumm tensorview -> torch tensor on `device` (no copy where possible)."""
    if isinstance(points, torch.Tensor):
        t = points
    elif isinstance(points, np.ndarray):
        t = torch.from_numpy(np.ascontiguousarray(points))
    elif _is_tensorview(points):
        # A CPU tensorview (device -1) shares its memory with numpy; a GPU one is copied through the host.
        arr = points.numpy_view() if points.device == -1 else points.cpu().numpy()
        t = torch.from_numpy(np.ascontiguousarray(arr))
    else:
        raise TypeError(f"points must be a numpy array, torch tensor or cumm tensorview, got {type(points).__name__}")
    if t.dtype not in (torch.float32, torch.float64):
        raise TypeError(f"points must be float32 or float64, got {t.dtype}")
    return t.to(device)


class _Point2VoxelBase:
    _NDIM = 3
    _DEVICE_TYPE = "cpu"

    def __init__(self, vsize_xyz: Sequence[float], coors_range_xyz: Sequence[float], num_point_features: int,
                 max_num_voxels: int, max_num_points_per_voxel: int):
        if len(vsize_xyz) != self._NDIM:
            raise ValueError(f"{type(self).__name__} needs {self._NDIM} voxel sizes, got vsize_xyz={list(vsize_xyz)}")
        vsize, grid_size, grid_stride, coors_range = calc_point2voxel_meta_data(vsize_xyz, coors_range_xyz)
        if int(num_point_features) < self._NDIM:
            raise ValueError(f"num_point_features must be >= {self._NDIM}, got {num_point_features}")
        if int(max_num_voxels) < 0:
            raise ValueError(f"max_num_voxels must be >= 0, got {max_num_voxels}")
        if int(max_num_points_per_voxel) < 1:
            raise ValueError(f"max_num_points_per_voxel must be >= 1, got {max_num_points_per_voxel}")
        self.vsize = vsize
        self._grid_size = grid_size
        self.grid_stride = grid_stride
        self.coors_range = coors_range
        self.num_point_features = int(num_point_features)
        self.max_num_voxels = int(max_num_voxels)
        self.max_num_points_per_voxel = int(max_num_points_per_voxel)

    @property
    def grid_size(self) -> List[int]:
        """Voxels per dimension, zyx order (as spconv)."""
        return list(self._grid_size)

    @staticmethod
    def calc_meta_data(vsize_xyz: Sequence[float], coors_range_xyz: Sequence[float]
                       ) -> Tuple[List[float], List[int], List[int], List[float]]:
        """``(vsize, grid_size, grid_stride, coors_range)`` in zyx order."""
        return calc_point2voxel_meta_data(vsize_xyz, coors_range_xyz)

    def _device(self) -> torch.device:
        if self._DEVICE_TYPE == "cuda":
            if not torch.cuda.is_available():
                raise RuntimeError(f"{type(self).__name__} needs a GPU, and torch sees none")
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def _run(self, points, empty_mean: bool):
        pts = _as_torch_points(points, self._device())
        if pts.dim() != 2 or pts.shape[1] != self.num_point_features:
            raise ValueError(f"points must have shape [N, num_point_features={self.num_point_features}], "
                             f"got {list(pts.shape)}")
        with torch.no_grad():
            voxels, indices, num_per_voxel, _ = point_to_voxel_op(
                pts, self.vsize, self.coors_range, self._grid_size, self.max_num_voxels,
                self.max_num_points_per_voxel, empty_mean)
        return _to_tensorview(voxels.to(torch.float32)), _to_tensorview(indices), _to_tensorview(num_per_voxel)


class _Point2VoxelCPU(_Point2VoxelBase):
    """spconv 2.x ``Point2VoxelCPU``: voxels in first-point order, coordinates zyx, fresh results per call.

    ``point_to_voxel_empty_mean`` fills unused rows with each voxel's own mean (spconv's CPU build leaks the
    previous voxel's mean into it; see ``spconv.pytorch.utils.PointToVoxel``).
    """

    def point_to_voxel(self, points, clear_voxels: bool = True):
        """``(voxels, indices, num_per_voxel)``; ``clear_voxels`` is accepted for compatibility (padding is
        always zero)."""
        return self._run(points, empty_mean=False)

    def point_to_voxel_empty_mean(self, points, clear_voxels: bool = True):
        return self._run(points, empty_mean=True)


class _Point2VoxelGPU(_Point2VoxelBase):
    """spconv 2.x ``Point2Voxel`` (GPU): same results as the CPU class, computed on the current GPU."""

    _DEVICE_TYPE = "cuda"

    def point_to_voxel_hash(self, points, clear_voxels: bool = True, empty_mean: bool = False, stream_int: int = 0):
        """``(voxels, indices, num_per_voxel)`` on the GPU; runs on torch's current stream (``stream_int`` is
        accepted for compatibility)."""
        return self._run(points, empty_mean=empty_mean)


def _make(base, ndim: int, name: str):
    return type(name, (base,), {"_NDIM": ndim, "__doc__": base.__doc__, "__module__": __name__})


Point2VoxelCPU1d = _make(_Point2VoxelCPU, 1, "Point2VoxelCPU1d")
Point2VoxelCPU2d = _make(_Point2VoxelCPU, 2, "Point2VoxelCPU2d")
Point2VoxelCPU3d = _make(_Point2VoxelCPU, 3, "Point2VoxelCPU3d")
Point2VoxelCPU4d = _make(_Point2VoxelCPU, 4, "Point2VoxelCPU4d")
Point2VoxelGPU1d = _make(_Point2VoxelGPU, 1, "Point2VoxelGPU1d")
Point2VoxelGPU2d = _make(_Point2VoxelGPU, 2, "Point2VoxelGPU2d")
Point2VoxelGPU3d = _make(_Point2VoxelGPU, 3, "Point2VoxelGPU3d")
Point2VoxelGPU4d = _make(_Point2VoxelGPU, 4, "Point2VoxelGPU4d")
