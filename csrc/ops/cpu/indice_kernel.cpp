// CPU implementation of get_indice_pairs: kernel maps from radix-sorted coordinate keys (native route).
#include <ATen/ATen.h>
#include <torch/library.h>

#include <cstring>

#include "../checks.h"
#include "../../native/indice_pairs.h"

namespace spconv {
namespace ops {
namespace {

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> get_indice_pairs_cpu(
    const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
    at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool subm,
    bool transpose) {
  const int64_t ndim = static_cast<int64_t>(spatial_shape.size());
  const ConvGeometry g =
      check_indice_pairs_args(indices_arg, spatial_shape, out_shape, ksize, stride, padding, dilation, subm);
  at::Tensor indices = indices_arg.contiguous();
  check_coordinates(indices, batch_size, g);
  const int64_t n = indices.size(0);
  const int32_t* ip = indices.const_data_ptr<int32_t>();

  native::KernelMap map;
  at::Tensor out_indices;
  if (subm) {
    int64_t dup = native::build_subm_map(ip, n, g, map);
    TORCH_CHECK_VALUE(dup < 0, "indices row ", dup, " repeats the coordinate of an earlier row; "
                      "submanifold convolution needs unique coordinates");
    // An op output may not alias its input (schema): a copy, on this thread (ATen's parallel copy would start
    // a parallel region for a few hundred kilobytes).
    out_indices = at::empty_like(indices, at::MemoryFormat::Contiguous);
    std::memcpy(out_indices.mutable_data_ptr<int32_t>(), ip, static_cast<size_t>(indices.numel()) * sizeof(int32_t));
  } else {
    native::build_conv_map(ip, n, g, transpose, map);
    out_indices = at::empty({map.num_out, ndim + 1}, indices.options());
    std::copy(map.out_indices.begin(), map.out_indices.end(), out_indices.mutable_data_ptr<int32_t>());
  }
  at::Tensor pair_offsets = at::empty({g.kvol + 1}, indices.options().dtype(at::kLong));
  int64_t* po = pair_offsets.mutable_data_ptr<int64_t>();
  auto block_counts = native::count_pairs(map, n, g.kvol, po);
  const int64_t total = po[g.kvol];
  at::Tensor pair_in = at::empty({total}, indices.options());
  at::Tensor pair_out = at::empty({total}, indices.options());
  native::compact_pairs(map, map.rows_are_outputs ? map.num_out : n, g.kvol, po, std::move(block_counts),
                        pair_in.mutable_data_ptr<int32_t>(), pair_out.mutable_data_ptr<int32_t>());
  at::Tensor map_info = make_map_info(pair_offsets, n, out_indices.size(0), map.repeat_free,
                                      /*mirrored=*/subm && map.repeat_free && subm_map_mirrored(g));
  // The table is handed over as it is (rows: the inputs, which for subm are the outputs).
  int32_t* raw = map.table.release();
  at::Tensor table = at::from_blob(raw, {n, g.kvol}, [](void* p) { delete[] static_cast<int32_t*>(p); },
                                   indices.options());
  return {out_indices, pair_in, pair_out, pair_offsets, map_info, table};
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) { m.impl("get_indice_pairs", &get_indice_pairs_cpu); }

}  // namespace ops
}  // namespace spconv
