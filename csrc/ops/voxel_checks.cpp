#include "voxel_checks.h"

#include <cmath>
#include <limits>

namespace spconv {
namespace ops {

VoxelOutputs voxel_outputs(int64_t m, int64_t ndim, int64_t max_points, int64_t c, const at::TensorOptions& opts) {
  return {at::zeros({m, max_points, c}, opts), at::empty({m, ndim}, opts.dtype(at::kInt)),
          at::empty({m}, opts.dtype(at::kInt))};
}

native::VoxelGridSpec check_point_to_voxel_args(const at::Tensor& points, at::ArrayRef<double> vsize,
                                                at::ArrayRef<double> coors_range, at::IntArrayRef grid_size,
                                                int64_t max_num_voxels, int64_t max_num_points_per_voxel) {
  const int64_t ndim = static_cast<int64_t>(vsize.size());
  TORCH_CHECK_VALUE(ndim >= 1 && ndim <= native::kMaxVoxelDim, "vsize must have 1 to ", native::kMaxVoxelDim,
                    " entries, got ", ndim);
  TORCH_CHECK_VALUE(static_cast<int64_t>(coors_range.size()) == 2 * ndim, "coors_range must have ", 2 * ndim,
                    " entries (lower corner then upper corner), got ", coors_range.size());
  TORCH_CHECK_VALUE(static_cast<int64_t>(grid_size.size()) == ndim, "grid_size must have ", ndim, " entries, got ",
                    grid_size.size());
  TORCH_CHECK_TYPE(points.scalar_type() == at::kFloat || points.scalar_type() == at::kDouble,
                   "points must be float32 or float64, got ", points.scalar_type());
  TORCH_CHECK_VALUE(points.dim() == 2 && points.size(1) >= ndim, "points must have shape [N, C] with C >= ", ndim,
                    ", got ", points.sizes());
  TORCH_CHECK_VALUE(points.size(0) < std::numeric_limits<int32_t>::max(), "points has too many rows (",
                    points.size(0), "); at most 2^31 - 2 are supported");
  TORCH_CHECK_VALUE(max_num_voxels >= 0, "max_num_voxels must be >= 0, got ", max_num_voxels);
  TORCH_CHECK_VALUE(max_num_points_per_voxel >= 1, "max_num_points_per_voxel must be >= 1, got ",
                    max_num_points_per_voxel);
  native::VoxelGridSpec spec{};
  spec.ndim = static_cast<int>(ndim);
  int64_t volume = 1;
  for (int64_t j = 0; j < ndim; ++j) {
    TORCH_CHECK_VALUE(std::isfinite(vsize[j]) && vsize[j] > 0, "vsize entries must be positive, got ", vsize);
    TORCH_CHECK_VALUE(std::isfinite(coors_range[j]), "coors_range entries must be finite, got ", coors_range);
    TORCH_CHECK_VALUE(grid_size[j] >= 1 && grid_size[j] <= std::numeric_limits<int32_t>::max(),
                      "grid_size entries must be in [1, 2^31), got ", grid_size);
    TORCH_CHECK_VALUE(volume <= std::numeric_limits<int64_t>::max() / grid_size[j],
                      "grid_size volume overflows int64: ", grid_size);
    volume *= grid_size[j];
    spec.vsize[j] = static_cast<float>(vsize[j]);
    spec.lo[j] = static_cast<float>(coors_range[j]);
    spec.grid[j] = static_cast<int32_t>(grid_size[j]);
  }
  return spec;
}

}  // namespace ops
}  // namespace spconv
