// Argument checks of the grouped-convolution ops, shared by the CPU and GPU glue (header-only, like
// fused_checks.h). Filters are [kvol, G, Cin/G, Cout/G]; messages name the argument.
#pragma once
#include <ATen/ATen.h>

#include "checks.h"

namespace spconv {
namespace ops {

// filters [kvol, G, cig, cog] against features [N, G * cig]: shape, dtype and device.
inline void check_grouped_filters(const at::Tensor& filters, const at::Tensor& features, int64_t kvol) {
  TORCH_CHECK_VALUE(filters.dim() == 4 && filters.size(0) == kvol && filters.size(1) >= 1,
                    "filters must be [kvol=", kvol, ", groups, Cin/groups, Cout/groups], got ", filters.sizes());
  TORCH_CHECK_VALUE(filters.size(1) * filters.size(2) == features.size(1), "filters expect groups ",
                    filters.size(1), " x ", filters.size(2), " = ", filters.size(1) * filters.size(2),
                    " input channels but features have ", features.size(1));
  TORCH_CHECK_TYPE(filters.scalar_type() == features.scalar_type(), "filters dtype ", filters.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(filters.device() == features.device(), "filters are on ", filters.device(),
                    " but features on ", features.device());
}

// out_grad [num_out, G * cog] of the features' dtype and device.
inline void check_grouped_out_grad(const at::Tensor& out_grad, const at::Tensor& filters,
                                   const at::Tensor& features, int64_t num_out) {
  check_features(out_grad, "out_grad");
  TORCH_CHECK_VALUE(out_grad.size(0) == num_out, "out_grad has ", out_grad.size(0), " rows but the map has ",
                    num_out, " outputs");
  TORCH_CHECK_VALUE(out_grad.size(1) == filters.size(1) * filters.size(3), "out_grad has ", out_grad.size(1),
                    " channels but filters produce ", filters.size(1) * filters.size(3));
  TORCH_CHECK_TYPE(out_grad.scalar_type() == features.scalar_type(), "out_grad dtype ", out_grad.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(out_grad.device() == features.device(), "out_grad is on ", out_grad.device(),
                    " but features on ", features.device());
}

// A neighbour table [rows, kvol] int32 on the features' device (its entries are checked where they are read).
inline void check_grouped_table(const at::Tensor& table, const char* name, const at::Tensor& features) {
  TORCH_CHECK_TYPE(table.scalar_type() == at::kInt, name, " must be int32, got ", table.scalar_type());
  TORCH_CHECK_VALUE(table.dim() == 2 && table.size(1) >= 1, name, " must be [num_rows, kvol], got ", table.sizes());
  TORCH_CHECK_VALUE(table.device() == features.device(), name, " is on ", table.device(), " but features on ",
                    features.device());
}

// grouped_conv: features, filters, the forward table nbr [num_out, kvol] and the reversed table
// nbr_t [num_in or 0, kvol] (only the backward reads it).
inline void check_grouped_conv_args(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                                    const at::Tensor& nbr_t) {
  check_features(features, "features");
  check_grouped_table(nbr, "nbr", features);
  check_grouped_table(nbr_t, "nbr_t", features);
  check_grouped_filters(filters, features, nbr.size(1));
  TORCH_CHECK_VALUE(nbr_t.size(1) == nbr.size(1), "nbr_t must have nbr's kernel volume ", nbr.size(1), ", got ",
                    nbr_t.sizes());
  TORCH_CHECK_VALUE(nbr_t.size(0) == 0 || nbr_t.size(0) == features.size(0), "nbr_t must have one row per input (",
                    features.size(0), ") or none, got ", nbr_t.sizes());
}

// grouped_conv_backward: the reversed table nbr_t [num_in, kvol] holds, per input row and offset, the output row.
inline void check_grouped_backward_args(const at::Tensor& features, const at::Tensor& filters,
                                        const at::Tensor& out_grad, const at::Tensor& nbr_t) {
  check_features(features, "features");
  check_grouped_table(nbr_t, "nbr_t", features);
  TORCH_CHECK_VALUE(nbr_t.size(0) == features.size(0), "nbr_t must have one row per input (", features.size(0),
                    "), got ", nbr_t.sizes(), " (the forward ran without the reversed table: no gradient needed)");
  check_grouped_filters(filters, features, nbr_t.size(1));
  check_grouped_out_grad(out_grad, filters, features, out_grad.size(0));
}

// indice_conv_grouped(_backward): features, filters and the kernel map (rows checked by check_pair_rows).
inline void check_indice_conv_grouped_args(const at::Tensor& features, const at::Tensor& filters,
                                           const at::Tensor& pair_in, const at::Tensor& pair_out,
                                           const at::Tensor& pair_offsets, int64_t num_out) {
  check_features(features, "features");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  check_grouped_filters(filters, features, pair_offsets.size(0) - 1);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be >= 0, got ", num_out);
}

// indice_conv_grouped_backward: the forward's checks, with out_grad's rows as the outputs.
inline void check_indice_conv_grouped_backward_args(const at::Tensor& features, const at::Tensor& filters,
                                                    const at::Tensor& out_grad, const at::Tensor& pair_in,
                                                    const at::Tensor& pair_out, const at::Tensor& pair_offsets) {
  check_indice_conv_grouped_args(features, filters, pair_in, pair_out, pair_offsets, out_grad.size(0));
  check_grouped_out_grad(out_grad, filters, features, out_grad.size(0));
}

// The pairs' rows checked against the row counts (check_pair_rows); returns the host copy of pair_offsets. The
// grouped glue checks a map through this one call only.
inline at::Tensor checked_pair_offsets(const at::Tensor& pair_in, const at::Tensor& pair_out,
                                       const at::Tensor& pair_offsets, int64_t num_in, int64_t num_out,
                                       const std::optional<at::Tensor>& map_info) {
  return check_pair_rows(pair_in, pair_out, pair_offsets, num_in, num_out, map_info).offsets;
}

// The row bound map_info gives a table's entries (the map's input rows for its forward table, its output rows
// for the reversed one), checked against the rows the table indexes; false without map_info (the caller then
// checks the entries themselves).
inline bool table_rows_bounded(const at::Tensor& table, int64_t n_src, const std::optional<at::Tensor>& map_info, bool reversed) {
  const auto info = read_map_info(map_info, table.size(1), /*npairs=*/-1);
  if (!info) return false;
  const int64_t bound = reversed ? info->out_rows : info->in_rows;
  TORCH_CHECK_VALUE(bound <= n_src, "map_info says the table indexes ", bound, " rows, but there are ", n_src);
  return true;
}

}  // namespace ops
}  // namespace spconv
