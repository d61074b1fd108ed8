"""Point cloud voxelization (spconv 2.x: ``spconv.pytorch.utils``).

Parameters are given in XYZ order (``vsize_xyz``, ``coors_range_xyz = [x0, y0, z0, x1, y1, z1]``); the
voxel indices come out in ZYX order (int32), ready for ``SparseConvTensor`` once a batch column is added.
"""
import math
from typing import List, Sequence, Tuple, Union

import numpy as np
import torch

from spconv import _backend  # loads the extension; _backend.ops is the op library the wrappers call

_ops = _backend.ops  # the selected op library (torch.ops.spconv unless a test swaps it)


def calc_point2voxel_meta_data(vsize_xyz: Sequence[float], coors_range_xyz: Sequence[float]
                               ) -> Tuple[List[float], List[int], List[int], List[float]]:
    """``(vsize, grid_size, grid_stride, coors_range)``, all in ZYX order, computed as spconv does.

    Sizes and corners are rounded to float32 and ``grid_size = round((hi - lo) / vsize)`` is evaluated in
    float32 (half away from zero), so the grid and the voxel of a boundary point match spconv's exactly.
    """
    ndim = len(vsize_xyz)
    if not 1 <= ndim <= 4:
        raise ValueError(f"vsize_xyz must have 1 to 4 entries, got {len(vsize_xyz)}")
    if len(coors_range_xyz) != 2 * ndim:
        raise ValueError(f"coors_range_xyz must have {2 * ndim} entries (lower corner then upper corner), "
                         f"got {len(coors_range_xyz)}")
    vs = np.asarray(vsize_xyz, dtype=np.float32)[::-1]
    lo = np.asarray(coors_range_xyz[:ndim], dtype=np.float32)[::-1]
    hi = np.asarray(coors_range_xyz[ndim:], dtype=np.float32)[::-1]
    if not (np.all(np.isfinite(vs)) and np.all(vs > 0)):
        raise ValueError(f"vsize_xyz entries must be positive and finite, got {list(vsize_xyz)}")
    if not (np.all(np.isfinite(lo)) and np.all(np.isfinite(hi))):
        raise ValueError(f"coors_range_xyz entries must be finite, got {list(coors_range_xyz)}")
    with np.errstate(over="ignore"):
        ratio = (hi - lo) / vs  # float32 arithmetic, as spconv's C++
    grid_size = [int(math.floor(abs(float(r)) + 0.5)) * (1 if r >= 0 else -1) for r in ratio]
    if any(g < 1 or g >= 2**31 for g in grid_size):
        raise ValueError(f"coors_range_xyz {list(coors_range_xyz)} with vsize_xyz {list(vsize_xyz)} gives grid size "
                         f"{grid_size[::-1]} (xyz); every entry must be in [1, 2^31)")
    grid_stride = [1] * ndim
    for i in range(ndim - 2, -1, -1):
        grid_stride[i] = grid_stride[i + 1] * grid_size[i + 1]
    return ([float(v) for v in vs], grid_size, grid_stride, [float(v) for v in lo] + [float(v) for v in hi])


def point_to_voxel_op(points: torch.Tensor, vsize_zyx: List[float], coors_range_zyx: List[float],
                      grid_size_zyx: List[int], max_num_voxels: int, max_num_points_per_voxel: int,
                      empty_mean: bool) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``point_to_voxel`` op: ``(voxels, indices, num_per_voxel, pc_voxel_id)``, voxels in the points' dtype."""
    return _ops.point_to_voxel(points, list(vsize_zyx), list(coors_range_zyx), list(grid_size_zyx),
                               int(max_num_voxels), int(max_num_points_per_voxel), bool(empty_mean))


@torch.library.register_fake("spconv::point_to_voxel")
def _point_to_voxel_fake(points, vsize, coors_range, grid_size, max_num_voxels, max_num_points_per_voxel,
                         empty_mean):
    num_voxels = torch.library.get_ctx().new_dynamic_size()
    voxels = points.new_empty((num_voxels, max_num_points_per_voxel, points.shape[1]))
    indices = points.new_empty((num_voxels, len(vsize)), dtype=torch.int32)
    num_per_voxel = points.new_empty((num_voxels,), dtype=torch.int32)
    pc_voxel_id = points.new_empty((points.shape[0],), dtype=torch.int64)
    return voxels, indices, num_per_voxel, pc_voxel_id


class PointToVoxel(object):
    """Voxelizes point clouds on one device (CPU, or a GPU when the extension was built with GPU kernels).

    Like spconv 2.x: voxels are numbered in the order of their first point, each voxel keeps its first
    ``max_num_points_per_voxel`` points in point order, points outside ``coors_range_xyz`` (lower corner
    inclusive, upper exclusive) are dropped, and once ``max_num_voxels`` voxels exist, points of new voxels are
    dropped. The CPU and GPU give identical results (spconv's GPU orders voxels by hash slot and points by
    thread race; here both are deterministic).

    Differences from spconv 2.x, none of which a model sees except the ``empty_mean`` fix:

    * ``empty_mean=True`` fills the unused rows of every voxel with the mean of that voxel's stored points.
      spconv's CPU build does not reset its per-voxel accumulator between voxels (it calls
      ``std::vector::clear()`` and then indexes the vector), so from the second voxel on the previous voxel's
      mean leaks into the value it writes; its GPU build is correct. Here CPU and GPU agree and are correct.
    * The returned tensors are fresh; spconv returns views of buffers it overwrites on the next call. For the
      same reason ``clear_voxels`` has no effect: unused rows are always zero (or the mean).
    * Points may be float32 or float64; voxels are float32 as in spconv.
    """

    def __init__(self, vsize_xyz: List[float], coors_range_xyz: List[float], num_point_features: int,
                 max_num_voxels: int, max_num_points_per_voxel: int,
                 device: torch.device = torch.device("cpu:0")):
        self.ndim = len(vsize_xyz)
        self.device = torch.device(device)
        if self.device.type not in ("cpu", "cuda"):
            raise ValueError(f"device must be a CPU or GPU device, got {self.device}")
        vsize, grid_size, grid_stride, coors_range = calc_point2voxel_meta_data(vsize_xyz, coors_range_xyz)
        if int(num_point_features) < self.ndim:
            raise ValueError(f"num_point_features must be >= {self.ndim} (the coordinates), got {num_point_features}")
        if int(max_num_voxels) < 0:
            raise ValueError(f"max_num_voxels must be >= 0, got {max_num_voxels}")
        if int(max_num_points_per_voxel) < 1:
            raise ValueError(f"max_num_points_per_voxel must be >= 1, got {max_num_points_per_voxel}")
        self.num_point_features = int(num_point_features)
        self.max_num_voxels = int(max_num_voxels)
        self.max_num_points_per_voxel = int(max_num_points_per_voxel)
        # ZYX order, like spconv's attributes of the same names.
        self.vsize = vsize
        self.grid_size = grid_size
        self.grid_stride = grid_stride
        self.coors_range = coors_range

    def __call__(self, pc: torch.Tensor, clear_voxels: bool = True, empty_mean: bool = False):
        """``(voxels, indices, num_per_voxel)`` of point cloud ``pc`` [N, num_point_features].

        voxels [M, max_num_points_per_voxel, num_point_features] float32, indices [M, ndim] int32 (zyx),
        num_per_voxel [M] int32.
        """
        res = self.generate_voxel_with_id(pc, clear_voxels, empty_mean)
        return res[0], res[1], res[2]

    def generate_voxel_with_id(self, pc: torch.Tensor, clear_voxels: bool = True, empty_mean: bool = False):
        """``(voxels, indices, num_per_voxel, pc_voxel_id)``; pc_voxel_id [N] int64 is each point's voxel row,
        or -1 for dropped points (outside the range or beyond ``max_num_voxels``). A point of a full voxel
        keeps its voxel's id although the voxel does not store it."""
        if not isinstance(pc, torch.Tensor):
            raise TypeError(f"pc must be a torch.Tensor, got {type(pc).__name__}")
        if pc.device.type != self.device.type:
            raise ValueError(f"pc is on {pc.device} but this PointToVoxel was built for {self.device}")
        if pc.dim() != 2 or pc.shape[1] != self.num_point_features:
            raise ValueError(f"pc must have shape [N, num_point_features={self.num_point_features}], "
                             f"got {list(pc.shape)}")
        with torch.no_grad():
            voxels, indices, num_per_voxel, pc_voxel_id = point_to_voxel_op(
                pc, self.vsize, self.coors_range, self.grid_size, self.max_num_voxels,
                self.max_num_points_per_voxel, empty_mean)
        return voxels.to(torch.float32), indices, num_per_voxel, pc_voxel_id


def gather_features_by_pc_voxel_id(seg_res_features: torch.Tensor, pc_voxel_id: torch.Tensor,
                                   invalid_value: Union[int, float] = 0) -> torch.Tensor:
    """Per-point features from per-voxel results: row i is ``seg_res_features[pc_voxel_id[i]]``, or
    ``invalid_value`` where ``pc_voxel_id[i] == -1``."""
    if pc_voxel_id.dim() != 1:
        raise ValueError(f"pc_voxel_id must be 1-D, got shape {list(pc_voxel_id.shape)}")
    if pc_voxel_id.dtype not in (torch.int32, torch.int64):
        raise TypeError(f"pc_voxel_id must be int32 or int64, got {pc_voxel_id.dtype}")
    pc_voxel_id = pc_voxel_id.to(seg_res_features.device)
    bad = (pc_voxel_id < -1) | (pc_voxel_id >= seg_res_features.shape[0])
    if pc_voxel_id.numel() > 0 and bool(bad.any()):
        raise ValueError(f"pc_voxel_id entries must be -1 or in [0, {seg_res_features.shape[0]})")
    shape = (pc_voxel_id.shape[0], *seg_res_features.shape[1:])
    res = torch.full(shape, invalid_value, dtype=seg_res_features.dtype, device=seg_res_features.device)
    valid = torch.nonzero(pc_voxel_id != -1).view(-1)
    res[valid] = seg_res_features[pc_voxel_id[valid]]
    return res
