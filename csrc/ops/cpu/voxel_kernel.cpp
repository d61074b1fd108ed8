// CPU implementation of point_to_voxel (native route): checks, allocation, then csrc/native/point_to_voxel.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../voxel_checks.h"
#include "../../native/point_to_voxel.h"

namespace spconv {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> point_to_voxel_cpu(
    const at::Tensor& points_arg, at::ArrayRef<double> vsize, at::ArrayRef<double> coors_range,
    at::IntArrayRef grid_size, int64_t max_num_voxels, int64_t max_num_points_per_voxel, bool empty_mean) {
  const native::VoxelGridSpec spec =
      check_point_to_voxel_args(points_arg, vsize, coors_range, grid_size, max_num_voxels, max_num_points_per_voxel);
  const at::Tensor points = points_arg.contiguous();
  const int64_t n = points.size(0), c = points.size(1);
  at::Tensor keys = at::empty({n}, points.options().dtype(at::kLong));
  at::Tensor pc_voxel_id = at::empty({n}, points.options().dtype(at::kLong));
  std::vector<int32_t> slot(static_cast<size_t>(n));
  std::vector<int64_t> voxel_keys;
  std::vector<int32_t> counts;
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "point_to_voxel_keys", [&] {
    native::point_voxel_keys<scalar_t>(points.const_data_ptr<scalar_t>(), n, c, spec,
                                       keys.mutable_data_ptr<int64_t>());
  });
  const int64_t m = native::assign_voxels(keys.const_data_ptr<int64_t>(), n, max_num_voxels,
                                          pc_voxel_id.mutable_data_ptr<int64_t>(), slot.data(), voxel_keys, counts);
  auto [voxels, indices, num_per_voxel] = voxel_outputs(m, spec.ndim, max_num_points_per_voxel, c, points.options());
  int32_t* num = num_per_voxel.mutable_data_ptr<int32_t>();
  for (int64_t v = 0; v < m; ++v) num[v] = static_cast<int32_t>(std::min<int64_t>(counts[v], max_num_points_per_voxel));
  native::decode_voxel_keys(voxel_keys.data(), m, spec, indices.mutable_data_ptr<int32_t>());
  AT_DISPATCH_FLOATING_TYPES(points.scalar_type(), "point_to_voxel_fill", [&] {
    native::scatter_points<scalar_t>(points.const_data_ptr<scalar_t>(), n, c, pc_voxel_id.const_data_ptr<int64_t>(),
                                     slot.data(), max_num_points_per_voxel, voxels.mutable_data_ptr<scalar_t>());
    if (empty_mean)
      native::fill_empty_with_mean<scalar_t>(voxels.mutable_data_ptr<scalar_t>(), num, m, max_num_points_per_voxel,
                                             c);
  });
  return {voxels, indices, num_per_voxel, pc_voxel_id};
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) { m.impl("point_to_voxel", &point_to_voxel_cpu); }

}  // namespace ops
}  // namespace spconv
