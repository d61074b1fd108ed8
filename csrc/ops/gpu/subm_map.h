// The GPU glue's submanifold kernel map (subm_map_gpu.cpp), shared with get_indice_pairs (indice_gpu.cpp).
#pragma once
#include <ATen/ATen.h>

#include <tuple>

#include "spconv/coords.h"

namespace spconv {
namespace ops {

// Everything a SubM map is on the device, built without a host read: the out->in table nbr [n, kvol], pair_offsets
// [kvol + 1] int64, status int32 [4] (gpu::SubmStatus: the smallest row out of the grid, the smallest row that
// repeats a coordinate, INT32_MAX for none; the table-full flag) and, for num_splits > 0, the fused route's masks
// and order [num_splits, n] (build_fused_map's).
struct SubmMap {
  at::Tensor nbr, masks, order, offsets, status;
};
SubmMap build_subm_map(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g, int64_t num_splits);

// Raises the CPU route's error for the indices a map's status (its host copy, widened to int64) flags, if any.
void check_subm_status(const int64_t* status_host, const at::Tensor& indices, int64_t batch_size,
                       const ConvGeometry& g);

// The map's one host read: status and pair_offsets. Raises the CPU route's errors for bad indices (naming the
// first bad row), then compacts the table into (pair_in, pair_out) and makes map_info.
std::tuple<at::Tensor, at::Tensor, at::Tensor> subm_pairs_of(const at::Tensor& indices, int64_t batch_size,
                                                             const ConvGeometry& g, const at::Tensor& nbr,
                                                             const at::Tensor& offsets, const at::Tensor& status);

}  // namespace ops
}  // namespace spconv
