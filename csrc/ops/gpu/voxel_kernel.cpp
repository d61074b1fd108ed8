// GPU implementation of point_to_voxel: the kernels of csrc/hip/point_to_voxel.cu, with the prefix sum and
// the stable sort done by ATen (cub / hipcub underneath). Deterministic; the same result as the CPU route.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "../checks.h"
#include "../voxel_checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> point_to_voxel_gpu(
    const at::Tensor& points_arg, at::ArrayRef<double> vsize, at::ArrayRef<double> coors_range,
    at::IntArrayRef grid_size, int64_t max_num_voxels, int64_t max_num_points_per_voxel, bool empty_mean) {
  const native::VoxelGridSpec spec =
      check_point_to_voxel_args(points_arg, vsize, coors_range, grid_size, max_num_voxels, max_num_points_per_voxel);
  c10::DeviceGuard guard(points_arg.device());
  void* stream = current_stream(points_arg.device());
  const at::Tensor points = points_arg.contiguous();
  const int64_t n = points.size(0), c = points.size(1);
  const auto opts = points.options();
  at::Tensor pc_voxel_id = at::full({n}, -1, opts.dtype(at::kLong));
  const auto empty_result = [&] {
    auto [voxels, indices, num] = voxel_outputs(0, spec.ndim, max_num_points_per_voxel, c, opts);
    return std::make_tuple(voxels, indices, num, pc_voxel_id);
  };
  if (n == 0) return empty_result();

  int64_t cap = 16;
  while (cap < 2 * n) cap <<= 1;
  at::Tensor keys = at::empty({n}, opts.dtype(at::kLong));
  at::Tensor hkeys = at::full({cap}, -1, opts.dtype(at::kLong));
  at::Tensor hvals = at::full({cap}, std::numeric_limits<int32_t>::max(), opts.dtype(at::kInt));
  at::Tensor first = at::empty({n}, opts.dtype(at::kInt));
  check_launch(gpu::p2v_first_points(gpu_dtype(points.scalar_type()), points.const_data_ptr(), n, c, spec.ndim,
                                     spec.vsize, spec.lo, spec.grid, keys.mutable_data_ptr<int64_t>(),
                                     hkeys.mutable_data_ptr<int64_t>(), hvals.mutable_data_ptr<int32_t>(), cap,
                                     first.mutable_data_ptr<int32_t>(), stream),
               "p2v_first_points");
  at::Tensor rank = at::cumsum(first, 0, at::kInt);
  const int64_t total = to_host(rank[n - 1]).item<int64_t>();
  const int64_t m = std::min(total, max_num_voxels);
  auto [voxels, indices, num_per_voxel] = voxel_outputs(m, spec.ndim, max_num_points_per_voxel, c, opts);
  check_launch(gpu::p2v_assign(keys.const_data_ptr<int64_t>(), n, first.const_data_ptr<int32_t>(),
                               rank.const_data_ptr<int32_t>(), hkeys.const_data_ptr<int64_t>(),
                               hvals.mutable_data_ptr<int32_t>(), cap, max_num_voxels, spec.ndim, spec.grid,
                               indices.mutable_data_ptr<int32_t>(), pc_voxel_id.mutable_data_ptr<int64_t>(), stream),
               "p2v_assign");
  if (m == 0) return empty_result();
  auto sorted = at::sort(pc_voxel_id, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const at::Tensor& sorted_vid = std::get<0>(sorted);
  const at::Tensor& perm = std::get<1>(sorted);
  at::Tensor seg_start = at::empty({m}, opts.dtype(at::kLong));
  check_launch(gpu::p2v_fill(gpu_dtype(points.scalar_type()), points.const_data_ptr(), c,
                             sorted_vid.const_data_ptr<int64_t>(), perm.const_data_ptr<int64_t>(), n, m,
                             max_num_points_per_voxel, empty_mean, seg_start.mutable_data_ptr<int64_t>(),
                             voxels.mutable_data_ptr(), num_per_voxel.mutable_data_ptr<int32_t>(), stream),
               "p2v_fill");
  return {voxels, indices, num_per_voxel, pc_voxel_id};
}

}  // namespace

SPCONV_GPU_IMPL(m) { m.impl("point_to_voxel", &point_to_voxel_gpu); }

}  // namespace ops
}  // namespace spconv
