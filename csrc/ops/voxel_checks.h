// Argument checks of point_to_voxel, shared by the CPU and GPU glue. Messages name the argument.
#pragma once
#include <ATen/ATen.h>

#include "../native/point_to_voxel.h"

namespace spconv {
namespace ops {

// vsize, coors_range (lower corners then upper corners) and grid_size are in zyx order, as
// spconv.pytorch.utils computes them. Returns the grid with vsize and lower corner as float32.
native::VoxelGridSpec check_point_to_voxel_args(const at::Tensor& points, at::ArrayRef<double> vsize,
                                                at::ArrayRef<double> coors_range, at::IntArrayRef grid_size,
                                                int64_t max_num_voxels, int64_t max_num_points_per_voxel);

// The outputs for m voxels that the CPU and GPU glue both allocate: voxels [m, max_points, c] zero-filled
// (empty point slots stay 0), indices [m, ndim] and num_per_voxel [m] int32, on the options' device.
struct VoxelOutputs {
  at::Tensor voxels, indices, num_per_voxel;
};
VoxelOutputs voxel_outputs(int64_t m, int64_t ndim, int64_t max_points, int64_t c, const at::TensorOptions& opts);

}  // namespace ops
}  // namespace spconv
