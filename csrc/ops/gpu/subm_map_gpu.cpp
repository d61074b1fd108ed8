// GPU glue of the submanifold kernel map: three kernels (subm_map.cu) and, for the fused route, one sort of the
// row masks; no host read. The pairs, which the native route and the backward need on the host's terms (their
// count), are compacted from the table by subm_map_pairs when first asked for (spconv/pytorch/core.py PairMaps),
// with the map's one device->host copy, which also carries the device's checks of the indices; a map whose pairs
// are never read is checked at the next regular or pooling map's host read (subm_pending.h).
#include "subm_map.h"

#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <vector>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"
#include "map_common.h"
#include "subm_pending.h"

namespace spconv {
namespace ops {

SubmMap build_subm_map(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g, int64_t num_splits) {
  const int64_t n = indices.size(0), kvol = g.kvol;
  TORCH_CHECK_VALUE(n < (int64_t{1} << 31), "indices has ", n, " rows; kernel maps index rows with int32");
  void* stream = current_stream(indices.device());
  auto iopts = indices.options();
  auto lopts = iopts.dtype(at::kLong);
  const int64_t cap = gpu::hash_capacity(n);
  at::Tensor hkeys = at::empty({cap}, lopts), hvals = at::empty({cap}, iopts);
  SubmMap m{at::empty({n, kvol}, iopts), at::empty({num_splits, n}, iopts), at::Tensor(), at::empty({kvol + 1}, lopts),
            subm_status_row(indices, batch_size, g)};
  at::Tensor sort_keys = at::empty({num_splits, n}, lopts);
  gpu::SubmMapBuffers b{hkeys.mutable_data_ptr<int64_t>(),
                        hvals.mutable_data_ptr<int32_t>(),
                        cap,
                        m.nbr.mutable_data_ptr<int32_t>(),
                        num_splits > 0 ? m.masks.mutable_data_ptr<int32_t>() : nullptr,
                        num_splits > 0 ? reinterpret_cast<unsigned long long*>(sort_keys.mutable_data_ptr<int64_t>())
                                       : nullptr,
                        static_cast<int>(num_splits),
                        m.offsets.mutable_data_ptr<int64_t>(),
                        m.status.mutable_data_ptr<int32_t>()};
  const int32_t* ip = indices.const_data_ptr<int32_t>();
  check_launch(gpu::subm_map_init(b, n, kvol, stream), "subm_map_init");
  check_launch(gpu::subm_map_insert(ip, n, g, batch_size, b, stream), "subm_map_insert");
  check_launch(gpu::subm_map_probe(ip, n, g, batch_size, subm_map_mirrored(g), b, stream), "subm_map_probe");
  // The keys are the masks read as unsigned: a stable sort gives build_fused_map's order.
  m.order = num_splits > 0
                ? std::get<1>(at::sort(sort_keys, /*stable=*/true, /*dim=*/1, /*descending=*/false)).to(at::kInt)
                : at::empty({0, n}, iopts);
  return m;
}

void check_subm_status(const int64_t* status_host, const at::Tensor& indices, int64_t batch_size,
                       const ConvGeometry& g) {
  // In the CPU route's order: coordinates (naming the first bad row), the table, then duplicates.
  if (status_host[gpu::kSubmBadRow] != INT32_MAX) check_coordinates(to_host(indices).contiguous(), batch_size, g);
  TORCH_CHECK(status_host[gpu::kSubmFull] == 0, "get_indice_pairs: the coordinate hash table is full");
  if (status_host[gpu::kSubmDupRow] != INT32_MAX) raise_duplicate(to_host(indices).contiguous(), g);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> subm_pairs_of(const at::Tensor& indices, int64_t batch_size,
                                                             const ConvGeometry& g, const at::Tensor& nbr,
                                                             const at::Tensor& offsets, const at::Tensor& status) {
  const int64_t n = indices.size(0), kvol = g.kvol;
  const at::Tensor host = to_host(at::cat({status.to(at::kLong), offsets}));
  const int64_t* h = host.const_data_ptr<int64_t>();
  forget_subm_status(status);  // checked here, not at a later map's read
  check_subm_status(h, indices, batch_size, g);
  const at::Tensor offsets_host = host.narrow(0, gpu::kSubmStatusSize, kvol + 1);
  at::Tensor pair_in, pair_out;
  compact_table(nbr, offsets_host.const_data_ptr<int64_t>()[kvol], /*rows_are_outputs=*/true, pair_in, pair_out);
  return {pair_in, pair_out, make_map_info(offsets_host, n, n, /*repeat_free=*/true, subm_map_mirrored(g))};
}

namespace {

ConvGeometry subm_geometry(const at::Tensor& indices, int64_t batch_size, at::IntArrayRef spatial_shape,
                           at::IntArrayRef ksize, at::IntArrayRef dilation) {
  const std::vector<int64_t> ones(spatial_shape.size(), 1), zeros(spatial_shape.size(), 0);
  const ConvGeometry g =
      check_indice_pairs_args(indices, spatial_shape, spatial_shape, ksize, ones, zeros, dilation, /*subm=*/true);
  check_grid_volume(batch_size, g);
  return g;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> subm_kernel_map_gpu(
    const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape, at::IntArrayRef ksize,
    at::IntArrayRef dilation, int64_t num_splits) {
  const ConvGeometry g = subm_geometry(indices_arg, batch_size, spatial_shape, ksize, dilation);
  TORCH_CHECK_VALUE(num_splits >= 0 && num_splits <= std::min<int64_t>(4, g.kvol), "num_splits must be in [0, ",
                    std::min<int64_t>(4, g.kvol), "], got ", num_splits);
  c10::DeviceGuard guard(indices_arg.device());
  SubmMap m = build_subm_map(indices_arg.contiguous(), batch_size, g, num_splits);
  return {m.nbr, m.masks, m.order, m.offsets, m.status};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> subm_map_pairs_gpu(const at::Tensor& indices_arg, int64_t batch_size,
                                                                  at::IntArrayRef spatial_shape, at::IntArrayRef ksize,
                                                                  at::IntArrayRef dilation, const at::Tensor& nbr,
                                                                  const at::Tensor& pair_offsets,
                                                                  const at::Tensor& status) {
  const ConvGeometry g = subm_geometry(indices_arg, batch_size, spatial_shape, ksize, dilation);
  const int64_t n = indices_arg.size(0);
  TORCH_CHECK_TYPE(nbr.scalar_type() == at::kInt && status.scalar_type() == at::kInt &&
                       pair_offsets.scalar_type() == at::kLong,
                   "nbr and status must be int32 and pair_offsets int64 (subm_kernel_map's)");
  TORCH_CHECK_VALUE(nbr.dim() == 2 && nbr.size(0) == n && nbr.size(1) == g.kvol && pair_offsets.dim() == 1 &&
                        pair_offsets.size(0) == g.kvol + 1 && status.dim() == 1 &&
                        status.size(0) == gpu::kSubmStatusSize,
                    "nbr [", n, ", ", g.kvol, "], pair_offsets [", g.kvol + 1, "] and status [",
                    int64_t{gpu::kSubmStatusSize}, "] must be subm_kernel_map's for these indices, got ", nbr.sizes(),
                    ", ", pair_offsets.sizes(), " and ", status.sizes());
  TORCH_CHECK_VALUE(nbr.device() == indices_arg.device() && pair_offsets.device() == indices_arg.device() &&
                        status.device() == indices_arg.device(),
                    "nbr, pair_offsets and status must be on the indices' device ", indices_arg.device());
  c10::DeviceGuard guard(indices_arg.device());
  return subm_pairs_of(indices_arg, batch_size, g, nbr.contiguous(), pair_offsets.contiguous(), status.contiguous());
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("subm_kernel_map", &subm_kernel_map_gpu);
  m.impl("subm_map_pairs", &subm_map_pairs_gpu);
}

}  // namespace ops
}  // namespace spconv
