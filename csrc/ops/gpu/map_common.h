// Host-side helpers of the GPU submanifold kernel map's glue (subm_map_gpu.cpp).
#pragma once
#include <ATen/ATen.h>

#include <cstdlib>
#include <unordered_set>

#include "spconv/coords.h"

namespace spconv {
namespace ops {

// Same message as the CPU route: the first row whose coordinate repeats an earlier row's.
[[noreturn]] inline void raise_duplicate(const at::Tensor& indices_cpu, const ConvGeometry& g) {
  const int64_t n = indices_cpu.size(0), w = indices_cpu.size(1);
  const int32_t* p = indices_cpu.const_data_ptr<int32_t>();
  std::unordered_set<int64_t> seen;
  int64_t dup = -1;
  for (int64_t i = 0; i < n && dup < 0; ++i)
    if (!seen.insert(pack_key(p[i * w], p + i * w + 1, g.in_shape, g.ndim)).second) dup = i;
  TORCH_CHECK_VALUE(false, "indices row ", dup, " repeats the coordinate of an earlier row; "
                    "submanifold convolution needs unique coordinates");
  std::abort();
}

// table [rows, kvol] int32 (partner or -1) with `npairs` entries >= 0 -> pairs grouped by offset, rows ascending
// within an offset. The count comes from the host, so the compaction needs no device->host copy of its own.
inline void compact_table(const at::Tensor& table, int64_t npairs, bool rows_are_outputs, at::Tensor& pair_in,
                          at::Tensor& pair_out) {
  const int64_t rows = table.size(0);
  at::Tensor tt = table.t().contiguous();  // [kvol, rows]
  at::Tensor nz = at::nonzero_static(tt.ge(0), npairs);  // [P, 2] (k, row), row-major order
  at::Tensor k_idx = nz.select(1, 0), r_idx = nz.select(1, 1);
  at::Tensor partner = tt.view(-1).index_select(0, k_idx * rows + r_idx);
  at::Tensor row = r_idx.to(at::kInt);
  pair_in = rows_are_outputs ? partner : row;
  pair_out = rows_are_outputs ? row : partner;
}

}  // namespace ops
}  // namespace spconv
