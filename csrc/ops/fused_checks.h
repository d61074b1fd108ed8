// Argument checks of the fused-route ops, shared by the CPU reference and the GPU glue.
#pragma once
#include <ATen/ATen.h>

#include "checks.h"

namespace spconv {
namespace ops {

constexpr int64_t kMaxFusedSplits = 4;

inline void check_fused_map_args(const at::Tensor& pair_in, const at::Tensor& pair_out,
                                 const at::Tensor& pair_offsets, int64_t num_rows, int64_t num_splits) {
  check_pairs(pair_in, pair_out, pair_offsets, pair_in);
  TORCH_CHECK_VALUE(num_rows >= 0 && num_rows < (int64_t{1} << 31), "num_rows must be in [0, 2^31), got ",
                    num_rows);
  const int64_t kvol = pair_offsets.size(0) - 1;
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= std::min(kMaxFusedSplits, kvol), "num_splits must be in [1, ",
                    std::min(kMaxFusedSplits, kvol), "] for kvol=", kvol, ", got ", num_splits);
  TORCH_CHECK_VALUE(num_rows * kvol < (int64_t{1} << 40), "neighbour table too large: ", num_rows, " x ", kvol);
}

// fused_map_masks: any int32 [num_rows, kvol] table (its entries are only compared with 0).
inline void check_fused_masks_args(const at::Tensor& nbr, int64_t num_splits) {
  TORCH_CHECK_TYPE(nbr.scalar_type() == at::kInt, "nbr must be int32, got ", nbr.scalar_type());
  TORCH_CHECK_VALUE(nbr.dim() == 2 && nbr.size(1) >= 1, "nbr must be [num_rows, kvol], got ", nbr.sizes());
  TORCH_CHECK_VALUE(nbr.size(0) < (int64_t{1} << 31), "nbr has too many rows for int32 row ids: ", nbr.size(0));
  const int64_t kvol = nbr.size(1);
  TORCH_CHECK_VALUE(num_splits >= 1 && num_splits <= std::min(kMaxFusedSplits, kvol), "num_splits must be in [1, ",
                    std::min(kMaxFusedSplits, kvol), "] for kvol=", kvol, ", got ", num_splits);
}

// A neighbour table holds one input per (output, offset): a map repeating an output at one offset (duplicate
// input coordinates) can't be one table. The Python route splits such maps into rounds first.
inline void check_no_repeated_output(bool repeated) {
  TORCH_CHECK_VALUE(!repeated, "build_fused_map: two pairs share an output row at one kernel offset (duplicate ",
                    "input coordinates); split the map with spconv.pytorch.pair_rounds.split_rounds first");
}

inline void check_fused_conv_args(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                                  const at::Tensor& masks, const at::Tensor& order, bool allow_double) {
  check_features(features, "features");
  TORCH_CHECK_TYPE(allow_double || features.scalar_type() != at::kDouble,
                   "fused_conv on the GPU supports float32, float16 and bfloat16, got float64");
  TORCH_CHECK_TYPE(nbr.scalar_type() == at::kInt && masks.scalar_type() == at::kInt && order.scalar_type() == at::kInt,
                   "nbr, masks and order must be int32");
  TORCH_CHECK_VALUE(nbr.dim() == 2 && nbr.size(1) >= 1, "nbr must be [num_rows, kvol], got ", nbr.sizes());
  const int64_t n = nbr.size(0);
  TORCH_CHECK_VALUE(masks.dim() == 2 && masks.size(1) == n && masks.size(0) >= 1 &&
                        masks.size(0) <= std::min(kMaxFusedSplits, nbr.size(1)),
                    "masks must be [num_splits, num_rows=", n, "], got ", masks.sizes());
  TORCH_CHECK_VALUE(order.sizes() == masks.sizes(), "order must have the shape of masks ", masks.sizes(), ", got ",
                    order.sizes());
  check_filters(filters, features, nbr.size(1));
  TORCH_CHECK_VALUE(nbr.device() == features.device() && masks.device() == features.device() &&
                        order.device() == features.device(),
                    "nbr, masks and order must be on the features' device ", features.device());
}

// The table entries index the features and `order` picks the rows each tile writes: entries of nbr in
// [-1, num_in), and each split's order a permutation of [0, num_rows) (a row taken twice would be written by
// two tiles). One device->host copy of six numbers for tables on a GPU; none with map_info (the info of the map
// build_fused_map made the tables from, whose rows it bounds: the tables are trusted to be that op's).
inline void check_fused_tables(const at::Tensor& nbr, const at::Tensor& order, int64_t num_in,
                               const std::optional<at::Tensor>& map_info) {
  const int64_t n = nbr.size(0);
  if (auto info = read_map_info(map_info, nbr.size(1), /*npairs=*/-1)) {
    TORCH_CHECK_VALUE(info->in_rows <= num_in && info->out_rows <= n, "map_info says the tables index ",
                      info->in_rows, " feature rows and ", info->out_rows, " table rows, but there are ", num_in,
                      " and ", n);
    return;
  }
  if (n == 0) return;
  auto nbr_mm = at::aminmax(nbr);
  at::Tensor o = order.to(at::kLong);
  auto order_mm = at::aminmax(o);
  // Times each row is taken per split; indices clamped so that a bad order is reported, not indexed with.
  at::Tensor taken = at::zeros({order.size(0), n}, o.options());
  taken.scatter_add_(1, o.clamp(0, n - 1), at::ones_like(o));
  auto taken_mm = at::aminmax(taken);
  const at::Tensor h = to_host(at::stack({std::get<0>(nbr_mm).to(at::kLong), std::get<1>(nbr_mm).to(at::kLong),
                                          std::get<0>(order_mm), std::get<1>(order_mm), std::get<0>(taken_mm),
                                          std::get<1>(taken_mm)}));
  const int64_t* v = h.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(v[0] >= -1 && v[1] < num_in, "nbr holds rows outside [-1, ", num_in,
                    ") (the features' rows): min ", v[0], ", max ", v[1]);
  TORCH_CHECK_VALUE(v[2] >= 0 && v[3] < n && v[4] == 1 && v[5] == 1, "each row of order must be a permutation of [0, ",
                    n, "): values in [", v[2], ", ", v[3], "], some row taken ", v[5] != 1 ? v[5] : v[4], " times");
}

inline void check_fused_dfilter_args(const at::Tensor& features, const at::Tensor& out_grad,
                                     const at::Tensor& pair_in, const at::Tensor& pair_out,
                                     const at::Tensor& pair_offsets, bool allow_double) {
  check_features(features, "features");
  check_features(out_grad, "out_grad");
  TORCH_CHECK_TYPE(allow_double || features.scalar_type() != at::kDouble,
                   "fused_conv_dfilter on the GPU supports float32, float16 and bfloat16, got float64");
  TORCH_CHECK_TYPE(out_grad.scalar_type() == features.scalar_type(), "out_grad dtype ", out_grad.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(out_grad.device() == features.device(), "out_grad is on ", out_grad.device(),
                    " but features on ", features.device());
  check_pairs(pair_in, pair_out, pair_offsets, features);
}

// fused_conv_backward: features [num_in, Cin], filters [kvol, Cin, Cout], out_grad [num_out, Cout]; the dinput
// tables (need_dx) [num_in, kvol] with masks / order [S, num_in] (mirrored: S = 1 and num_in == num_out); the
// dfilter table [num_out or num_in (dw_by_output or not), kvol]; pair_offsets int64 [kvol + 1].
inline void check_fused_backward_args(const at::Tensor& features, const at::Tensor& filters,
                                      const at::Tensor& out_grad, const at::Tensor& nbr, const at::Tensor& masks,
                                      const at::Tensor& order, bool mirrored, const at::Tensor& dw_table,
                                      bool dw_by_output, const at::Tensor& pair_offsets, bool need_dx,
                                      bool allow_double) {
  check_features(features, "features");
  check_features(out_grad, "out_grad");
  TORCH_CHECK_TYPE(allow_double || features.scalar_type() != at::kDouble,
                   "fused_conv_backward on the GPU supports float32, float16 and bfloat16, got float64");
  TORCH_CHECK_TYPE(out_grad.scalar_type() == features.scalar_type(), "out_grad dtype ", out_grad.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(out_grad.device() == features.device(), "out_grad is on ", out_grad.device(),
                    " but features on ", features.device());
  TORCH_CHECK_VALUE(dw_table.dim() == 2 && dw_table.size(1) >= 1, "dw_table must be [num_rows, kvol], got ",
                    dw_table.sizes());
  const int64_t kvol = dw_table.size(1), num_in = features.size(0), num_out = out_grad.size(0);
  check_filters(filters, features, kvol);
  TORCH_CHECK_VALUE(filters.size(2) == out_grad.size(1), "filters give ", filters.size(2),
                    " output channels but out_grad has ", out_grad.size(1));
  TORCH_CHECK_TYPE(dw_table.scalar_type() == at::kInt, "dw_table must be int32");
  TORCH_CHECK_VALUE(dw_table.size(0) == (dw_by_output ? num_out : num_in), "dw_table must have one row per ",
                    dw_by_output ? "output (" : "input (", dw_by_output ? num_out : num_in, "), got ",
                    dw_table.size(0));
  TORCH_CHECK_TYPE(pair_offsets.scalar_type() == at::kLong, "pair_offsets must be int64");
  TORCH_CHECK_VALUE(pair_offsets.dim() == 1 && pair_offsets.size(0) == kvol + 1, "pair_offsets must be [kvol + 1 = ",
                    kvol + 1, "], got ", pair_offsets.sizes());
  TORCH_CHECK_VALUE(dw_table.device() == features.device() && pair_offsets.device() == features.device(),
                    "dw_table and pair_offsets must be on the features' device ", features.device());
  if (!need_dx) return;
  TORCH_CHECK_TYPE(nbr.scalar_type() == at::kInt && masks.scalar_type() == at::kInt && order.scalar_type() == at::kInt,
                   "nbr, masks and order must be int32");
  TORCH_CHECK_VALUE(nbr.dim() == 2 && nbr.size(0) == num_in && nbr.size(1) == kvol, "nbr must be [num_in=", num_in,
                    ", kvol=", kvol, "], got ", nbr.sizes());
  TORCH_CHECK_VALUE(masks.dim() == 2 && masks.size(1) == num_in && masks.size(0) >= 1 &&
                        masks.size(0) <= std::min(kMaxFusedSplits, kvol),
                    "masks must be [num_splits, num_in=", num_in, "], got ", masks.sizes());
  TORCH_CHECK_VALUE(order.sizes() == masks.sizes(), "order must have the shape of masks ", masks.sizes(), ", got ",
                    order.sizes());
  TORCH_CHECK_VALUE(!mirrored || (masks.size(0) == 1 && num_in == num_out),
                    "mirrored tables need one split and as many inputs as outputs, got ", masks.size(0), " splits, ",
                    num_in, " inputs, ", num_out, " outputs");
  TORCH_CHECK_VALUE(nbr.device() == features.device() && masks.device() == features.device() &&
                        order.device() == features.device(),
                    "nbr, masks and order must be on the features' device ", features.device());
}

// The rows the tables of fused_conv_backward index: none checked on the device with map_info (the forward map's
// record, whose tables they are); else the dinput tables as fused_conv's (entries index out_grad) and the
// dfilter table's entries, with one device->host copy each.
inline void check_fused_backward_tables(const at::Tensor& nbr, const at::Tensor& order, const at::Tensor& dw_table,
                                        bool dw_by_output, int64_t num_in, int64_t num_out, bool need_dx,
                                        bool need_dw, const std::optional<at::Tensor>& map_info) {
  if (auto info = read_map_info(map_info, dw_table.size(1), /*npairs=*/-1)) {
    TORCH_CHECK_VALUE(info->in_rows <= num_in && info->out_rows <= num_out, "map_info says the tables index ",
                      info->in_rows, " input rows and ", info->out_rows, " output rows, but there are ", num_in,
                      " and ", num_out);
    return;
  }
  if (need_dx) check_fused_tables(nbr, order, num_out, std::nullopt);
  if (need_dw && dw_table.numel() > 0) {
    const int64_t bound = dw_by_output ? num_in : num_out;
    auto mm = at::aminmax(dw_table);
    const at::Tensor h = to_host(at::stack({std::get<0>(mm), std::get<1>(mm)}).to(at::kLong));
    const int64_t* v = h.const_data_ptr<int64_t>();
    TORCH_CHECK_VALUE(v[0] >= -1 && v[1] < bound, "dw_table holds rows outside [-1, ", bound, "): min ", v[0],
                      ", max ", v[1]);
  }
}

}  // namespace ops
}  // namespace spconv
