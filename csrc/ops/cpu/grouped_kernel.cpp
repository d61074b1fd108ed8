// CPU implementation of the grouped-convolution ops (csrc/native/grouped_conv.h): over a neighbour table
// (grouped_conv, grouped_conv_backward: the tables are built once per kernel map and cached by the Python
// route) or over the pairs themselves (indice_conv_grouped*, regrouped by row on each call).
// FP16/BF16 are computed in FP32 and returned in their dtype; FP32 and FP64 compute natively.
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../checks.h"
#include "../grouped_checks.h"
#include "../../native/grouped_conv.h"
#include "../../native/pairs_by_row.h"
#include "../output_cache.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

native::GroupedRows table_rows(const at::Tensor& table, int64_t n_other) {
  native::GroupedRows r;
  r.rows = table.size(0);
  r.kvol = table.size(1);
  r.n_other = n_other;
  r.table = table.const_data_ptr<int32_t>();
  return r;
}

native::GroupedRows csr_rows(const native::PairsByRow& g, int64_t rows, int64_t kvol, int64_t n_other) {
  native::GroupedRows r;
  r.rows = rows;
  r.kvol = kvol;
  r.n_other = n_other;
  r.start = g.start.data();
  r.other = g.other.data();
  r.offset = g.offset.data();
  return r;
}

void check_table_entries(bool ok, const char* name, int64_t n_other) {
  TORCH_CHECK_VALUE(ok, name, " holds rows outside [-1, ", n_other, ") (the rows it indexes)");
}

// The CPU kernels check every table entry as they read it; map_info is only checked against the sizes.
at::Tensor grouped_conv_cpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                            const at::Tensor& nbr_t, const std::optional<at::Tensor>& map_info) {
  check_grouped_conv_args(features, filters, nbr, nbr_t);
  table_rows_bounded(nbr, features.size(0), map_info, /*reversed=*/false);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous(), w = filters.to(ct).contiguous(), nb = nbr.contiguous();
  at::Tensor y = empty_output({nb.size(0), w.size(1) * w.size(3)}, x.options());
  check_table_entries(native::grouped_forward(x, w, table_rows(nb, x.size(0)), y), "nbr", x.size(0));
  return y.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> grouped_conv_backward_cpu(const at::Tensor& features, const at::Tensor& filters,
                                                             const at::Tensor& out_grad, const at::Tensor& nbr_t,
                                                             const std::optional<at::Tensor>& map_info) {
  check_grouped_backward_args(features, filters, out_grad, nbr_t);
  table_rows_bounded(nbr_t, out_grad.size(0), map_info, /*reversed=*/true);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous(), dy = out_grad.to(ct).contiguous(), nb = nbr_t.contiguous();
  at::Tensor wt = filters.to(ct).transpose(2, 3).contiguous();
  at::Tensor dx = empty_output(x.sizes(), x.options()), dw = at::empty(filters.sizes(), x.options());
  check_table_entries(native::grouped_backward(x, wt, dy, table_rows(nb, dy.size(0)), dx, dw), "nbr_t",
                      dy.size(0));
  return {dx.to(features.scalar_type()), dw.to(filters.scalar_type())};
}

at::Tensor indice_conv_grouped_cpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& pair_in,
                                   const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_out,
                                   const std::optional<at::Tensor>& map_info) {
  check_indice_conv_grouped_args(features, filters, pair_in, pair_out, pair_offsets, num_out);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous(), w = filters.to(ct).contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  checked_pair_offsets(pin, pout, po, x.size(0), num_out, map_info);
  const int64_t kvol = w.size(0);
  const native::PairsByRow g = native::group_pairs_by_row(pout.const_data_ptr<int32_t>(),
                                                          pin.const_data_ptr<int32_t>(),
                                                          po.const_data_ptr<int64_t>(), kvol, num_out);
  at::Tensor y = empty_output({num_out, w.size(1) * w.size(3)}, x.options());
  native::grouped_forward(x, w, csr_rows(g, num_out, kvol, x.size(0)), y);
  return y.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_conv_grouped_backward_cpu(const at::Tensor& features,
                                                                    const at::Tensor& filters,
                                                                    const at::Tensor& out_grad,
                                                                    const at::Tensor& pair_in,
                                                                    const at::Tensor& pair_out,
                                                                    const at::Tensor& pair_offsets,
                                                                    const std::optional<at::Tensor>& map_info) {
  check_indice_conv_grouped_backward_args(features, filters, out_grad, pair_in, pair_out, pair_offsets);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous(), dy = out_grad.to(ct).contiguous();
  at::Tensor wt = filters.to(ct).transpose(2, 3).contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  checked_pair_offsets(pin, pout, po, x.size(0), dy.size(0), map_info);
  const int64_t kvol = wt.size(0);
  const native::PairsByRow g = native::group_pairs_by_row(pin.const_data_ptr<int32_t>(),
                                                          pout.const_data_ptr<int32_t>(),
                                                          po.const_data_ptr<int64_t>(), kvol, x.size(0));
  at::Tensor dx = empty_output(x.sizes(), x.options()), dw = at::empty(filters.sizes(), x.options());
  native::grouped_backward(x, wt, dy, csr_rows(g, x.size(0), kvol, dy.size(0)), dx, dw);
  return {dx.to(features.scalar_type()), dw.to(filters.scalar_type())};
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("grouped_conv", &grouped_conv_cpu);
  m.impl("grouped_conv_backward", &grouped_conv_backward_cpu);
  m.impl("indice_conv_grouped", &indice_conv_grouped_cpu);
  m.impl("indice_conv_grouped_backward", &indice_conv_grouped_backward_cpu);
}

}  // namespace ops
}  // namespace spconv
