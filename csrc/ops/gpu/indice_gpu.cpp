// GPU implementation of get_indice_pairs: hash-table kernel maps on the device, the CPU route's results bit for
// bit (docs/gpu_kernel_maps.md). One device->host copy per map (the checks, the output count, the pairs per
// offset: map_info). SubM maps: subm_map_gpu.cpp; regular, transposed and pooling maps: conv_map below, whose
// outputs are numbered in the CPU route's first-seen order.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <numeric>
#include <tuple>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"
#include "subm_map.h"
#include "subm_pending.h"

namespace spconv {
namespace ops {
namespace {

// The most distinct output keys a regular / transposed conv of n inputs can reach (the hash table's load):
// per dimension a regular conv reaches only the kernel positions o with c + padding - o * dilation divisible
// by the stride (one residue class of o modulo stride / gcd(stride, dilation)); and there are at most
// batch x out-grid sites. A 3^3 stride-2 conv: 8 per input, not 27.
int64_t max_output_keys(const ConvGeometry& g, bool transpose, int64_t n, int64_t batch_size) {
  int64_t per_input = 1, sites = batch_size;  // sites fits: check_grid_volume bounds it by 2^63
  for (int d = 0; d < g.ndim; ++d) {
    const int64_t k = g.ksize[d], period = g.stride[d] / std::gcd(g.stride[d], g.dilation[d]);
    per_input *= transpose ? k : (k + period - 1) / period;
    sites *= g.out_shape[d];
  }
  return std::min(n * per_input, sites);
}

// Tables are sized at >= 2x their keys, so a full one means a sizing bug: raise rather than lose keys.
void check_table_not_full(int64_t full, int64_t cap) {
  TORCH_CHECK(full == 0, "get_indice_pairs: the coordinate hash table (", cap, " slots) is full");
}

// A regular / transposed conv's (or pool's) map: four kernels (kernel_map.cu), a stable sort of the input keys,
// one scan of the kernels' flags and the one device->host copy (status: bad rows, a full table, duplicates, the
// output count, the pairs per offset), after which the output and pair buffers are sized and filled. With
// want_out_table, also the out->in table [num_out, kvol] (one fill more; written by the last kernel) where the
// map has no duplicate coordinates, else [0, kvol] (such a map repeats a row at one offset: no table serves it).
std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> conv_map(
    const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g, bool transpose, bool want_out_table) {
  const int64_t n = indices.size(0), kvol = g.kvol, visits = n * kvol;
  void* stream = current_stream(indices.device());
  auto iopts = indices.options();
  auto lopts = iopts.dtype(at::kLong);
  const int64_t cap = gpu::hash_capacity(max_output_keys(g, transpose, n, batch_size));
  at::Tensor in_keys = at::empty({n}, lopts), hkeys = at::empty({cap}, lopts), hvisit = at::empty({cap}, lopts);
  at::Tensor slot = at::empty({visits}, lopts), flags = at::empty({2 * visits}, lopts);
  at::Tensor status = at::empty({gpu::kMapCounts + kvol}, lopts), offsets = at::empty({kvol + 1}, lopts);
  const gpu::ConvMapBuffers b{in_keys.mutable_data_ptr<int64_t>(),
                              hkeys.mutable_data_ptr<int64_t>(),
                              reinterpret_cast<unsigned long long*>(hvisit.mutable_data_ptr<int64_t>()),
                              cap,
                              slot.mutable_data_ptr<int64_t>(),
                              flags.mutable_data_ptr<int64_t>(),
                              status.mutable_data_ptr<int64_t>(),
                              offsets.mutable_data_ptr<int64_t>()};
  const int32_t* ip = indices.const_data_ptr<int32_t>();
  check_launch(gpu::conv_map_init(ip, n, g, batch_size, b, stream), "conv_map_init");
  at::Tensor sorted_keys = in_keys, order = in_keys;  // no rows: nothing to sort or read
  if (n > 0) std::tie(sorted_keys, order) = at::sort(in_keys, /*stable=*/true, /*dim=*/0, /*descending=*/false);
  const int64_t* ord = order.const_data_ptr<int64_t>();
  check_launch(gpu::conv_map_insert(ip, sorted_keys.const_data_ptr<int64_t>(), ord, n, g, transpose, b, stream),
               "conv_map_insert");
  check_launch(gpu::conv_map_flags(ord, n, kvol, b, stream), "conv_map_flags");
  const at::Tensor scan = visits > 0 ? at::cumsum(flags, 0) : flags;
  // The map's one host read, which also carries the statuses of the SubM maps built since the last one
  // (subm_pending.h); their errors first (those layers ran first), then this map's in the CPU route's order.
  const PendingSubmRows pending = take_pending_subm(indices.device());
  const at::Tensor host = to_host(pending.statuses.defined() ? at::cat({status, pending.statuses}) : status);
  const int64_t* h = host.const_data_ptr<int64_t>();
  check_subm_statuses(pending, h + gpu::kMapCounts + kvol);
  if (h[gpu::kMapBadRow] != LLONG_MAX) {
    check_coordinates(to_host(indices).contiguous(), batch_size, g);  // raises, naming the first bad row
    TORCH_CHECK(false, "get_indice_pairs: indices row ", h[gpu::kMapBadRow], " lies outside the grid");
  }
  check_table_not_full(h[gpu::kMapFull], cap);
  const int64_t num_out = h[gpu::kMapNumOut];
  TORCH_CHECK_VALUE(num_out < (int64_t{1} << 31), "too many output coordinates: ", num_out);
  at::Tensor offsets_host = at::empty({kvol + 1}, at::dtype(at::kLong));
  int64_t* oh = offsets_host.mutable_data_ptr<int64_t>();
  oh[0] = 0;
  for (int64_t k = 0; k < kvol; ++k) oh[k + 1] = oh[k] + h[gpu::kMapCounts + k];
  at::Tensor out_indices = at::empty({num_out, g.ndim + 1}, iopts), table = at::empty({n, kvol}, iopts);
  at::Tensor pair_in = at::empty({oh[kvol]}, iopts), pair_out = at::empty({oh[kvol]}, iopts);
  const bool repeat_free = h[gpu::kMapDupRow] == 0;
  at::Tensor out_table = want_out_table && repeat_free ? at::full({num_out, kvol}, -1, iopts)
                                                       : at::empty({0, kvol}, iopts);
  check_launch(gpu::conv_map_write(ord, scan.const_data_ptr<int64_t>(), n, g, num_out, b,
                                   table.mutable_data_ptr<int32_t>(), pair_in.mutable_data_ptr<int32_t>(),
                                   pair_out.mutable_data_ptr<int32_t>(), out_indices.mutable_data_ptr<int32_t>(),
                                   out_table.numel() > 0 ? out_table.mutable_data_ptr<int32_t>() : nullptr, stream),
               "conv_map_write");
  return {out_indices, pair_in, pair_out, offsets, make_map_info(offsets_host, n, num_out, repeat_free), table,
          out_table};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> get_indice_pairs_gpu(
    const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
    at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool subm,
    bool transpose) {
  const ConvGeometry g =
      check_indice_pairs_args(indices_arg, spatial_shape, out_shape, ksize, stride, padding, dilation, subm);
  check_grid_volume(batch_size, g);
  c10::DeviceGuard guard(indices_arg.device());
  const at::Tensor indices = indices_arg.contiguous();
  if (subm) {  // subm_map_gpu.cpp: three kernels, then the one host read
    const SubmMap m = build_subm_map(indices, batch_size, g, /*num_splits=*/0);
    auto [sub_in, sub_out, info] = subm_pairs_of(indices, batch_size, g, m.nbr, m.offsets, m.status);
    return {indices_arg.clone(), sub_in, sub_out, m.offsets, info, m.nbr};  // outputs may not alias inputs
  }

  const auto m = conv_map(indices, batch_size, g, transpose, /*want_out_table=*/false);
  return {std::get<0>(m), std::get<1>(m), std::get<2>(m), std::get<3>(m), std::get<4>(m), std::get<5>(m)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor>
strided_kernel_map_gpu(const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape,
                       at::IntArrayRef out_shape, at::IntArrayRef ksize, at::IntArrayRef stride,
                       at::IntArrayRef padding, at::IntArrayRef dilation, bool transpose) {
  const ConvGeometry g = check_indice_pairs_args(indices_arg, spatial_shape, out_shape, ksize, stride, padding,
                                                 dilation, /*subm=*/false);
  check_grid_volume(batch_size, g);
  c10::DeviceGuard guard(indices_arg.device());
  return conv_map(indices_arg.contiguous(), batch_size, g, transpose, /*want_out_table=*/true);
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("get_indice_pairs", &get_indice_pairs_gpu);
  m.impl("strided_kernel_map", &strided_kernel_map_gpu);
}

}  // namespace ops
}  // namespace spconv
