// CPU reference of the fused route (build_fused_map, fused_conv, fused_conv_dfilter). It follows the GPU
// kernels' semantics exactly, masks included (an offset whose mask bit is clear is skipped even if the table
// has a neighbour), so that a mask or ordering bug shows on the CPU tests, and it is the oracle the GPU tests
// compare against. Splits run one after the other; each split's partial sum is rounded to the output dtype
// before the next split adds to it, as on the GPU.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/library.h>

#include <algorithm>
#include <numeric>
#include <vector>

#include "../checks.h"
#include "../fused_checks.h"

namespace spconv {
namespace ops {
namespace {

// masks and order of a neighbour table (schema.cpp, build_fused_map).
std::tuple<at::Tensor, at::Tensor> masks_and_order(const at::Tensor& nbr, int64_t num_splits) {
  const int64_t num_rows = nbr.size(0), kvol = nbr.size(1);
  const int32_t* nb = nbr.const_data_ptr<int32_t>();
  auto opts = nbr.options();
  at::Tensor masks = at::empty({num_splits, num_rows}, opts);
  int32_t* m = masks.mutable_data_ptr<int32_t>();
  for (int64_t s = 0; s < num_splits; ++s) {
    const int64_t k0 = s * kvol / num_splits, k1 = (s + 1) * kvol / num_splits;
    const int64_t gs = std::max<int64_t>(1, (k1 - k0 + 31) / 32);
    for (int64_t r = 0; r < num_rows; ++r) {
      uint32_t bits = 0;
      for (int64_t k = k0; k < k1; ++k)
        if (nb[r * kvol + k] >= 0) bits |= 1u << ((k - k0) / gs);
      m[s * num_rows + r] = static_cast<int32_t>(bits);
    }
  }
  at::Tensor order = at::empty({num_splits, num_rows}, opts);
  int32_t* o = order.mutable_data_ptr<int32_t>();
  for (int64_t s = 0; s < num_splits; ++s) {
    int32_t* os = o + s * num_rows;
    const int32_t* ms = m + s * num_rows;
    std::iota(os, os + num_rows, 0);
    std::stable_sort(os, os + num_rows, [&](int32_t a, int32_t b) {
      return static_cast<uint32_t>(ms[a]) < static_cast<uint32_t>(ms[b]);
    });
  }
  return {masks, order};
}

std::tuple<at::Tensor, at::Tensor> fused_map_masks_cpu(const at::Tensor& nbr, int64_t num_splits) {
  check_fused_masks_args(nbr, num_splits);
  return masks_and_order(nbr.contiguous(), num_splits);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_fused_map_cpu(const at::Tensor& pair_in_arg,
                                                                   const at::Tensor& pair_out_arg,
                                                                   const at::Tensor& pair_offsets_arg,
                                                                   int64_t num_rows, int64_t num_splits,
                                                                   const std::optional<at::Tensor>& map_info) {
  check_fused_map_args(pair_in_arg, pair_out_arg, pair_offsets_arg, num_rows, num_splits);
  const int64_t kvol = pair_offsets_arg.size(0) - 1;
  at::Tensor pair_in = pair_in_arg.contiguous(), pair_out = pair_out_arg.contiguous();
  at::Tensor po_t = pair_offsets_arg.contiguous();
  const int32_t* pin = pair_in.const_data_ptr<int32_t>();
  const int32_t* pout = pair_out.const_data_ptr<int32_t>();
  const int64_t* po = po_t.const_data_ptr<int64_t>();
  check_pair_layout_host(po, kvol, pair_in.size(0), nullptr, 0, 0);
  read_map_info(map_info, kvol, pair_in.size(0));  // the reference checks every pair below anyway
  auto opts = pair_in.options();
  at::Tensor nbr = at::full({num_rows, kvol}, -1, opts);
  int32_t* nb = nbr.mutable_data_ptr<int32_t>();
  for (int64_t k = 0; k < kvol; ++k)
    for (int64_t p = po[k]; p < po[k + 1]; ++p) {
      TORCH_CHECK_VALUE(pout[p] >= 0 && pout[p] < num_rows, "pair_out[", p, "] = ", pout[p],
                        " is outside [0, num_rows=", num_rows, ")");
      TORCH_CHECK_VALUE(pin[p] >= 0, "pair_in[", p, "] = ", pin[p], " is negative");
      check_no_repeated_output(nb[pout[p] * kvol + k] >= 0);
      nb[pout[p] * kvol + k] = pin[p];
    }
  auto [masks, order] = masks_and_order(nbr, num_splits);
  return {nbr, masks, order};
}

template <typename acc_t>
void fused_split(const acc_t* x, const acc_t* w, const int32_t* nb, const int32_t* ms, const int32_t* os,
                 int64_t n_out, int64_t kvol, int64_t cin, int64_t cout, int64_t k0, int64_t k1, acc_t* y) {
  const int64_t gs = std::max<int64_t>(1, (k1 - k0 + 31) / 32);
  at::parallel_for(0, n_out, 64, [&](int64_t b, int64_t e) {
    std::vector<acc_t> acc(static_cast<size_t>(cout));
    for (int64_t t = b; t < e; ++t) {
      const int64_t r = os[t];
      const uint32_t mask = static_cast<uint32_t>(ms[r]);
      std::fill(acc.begin(), acc.end(), acc_t(0));
      for (int64_t k = k0; k < k1; ++k) {
        if (!((mask >> ((k - k0) / gs)) & 1u)) continue;
        const int32_t src = nb[r * kvol + k];
        if (src < 0) continue;
        const acc_t* xr = x + static_cast<int64_t>(src) * cin;
        const acc_t* wk = w + k * cin * cout;
        for (int64_t c = 0; c < cin; ++c) {
          const acc_t xv = xr[c];
          const acc_t* wr = wk + c * cout;
          for (int64_t j = 0; j < cout; ++j) acc[j] += xv * wr[j];
        }
      }
      std::copy(acc.begin(), acc.end(), y + r * cout);
    }
  });
}

at::Tensor fused_conv_cpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr_arg,
                          const at::Tensor& masks_arg, const at::Tensor& order_arg,
                          const std::optional<at::Tensor>& map_info, bool /*tf32: the reference keeps FP32*/) {
  check_fused_conv_args(features, filters, nbr_arg, masks_arg, order_arg, /*allow_double=*/true);
  const int64_t n_out = nbr_arg.size(0), kvol = nbr_arg.size(1), cin = features.size(1), cout = filters.size(2);
  const int64_t splits = masks_arg.size(0);
  const auto ct = features.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor x = features.to(ct).contiguous(), w = filters.to(ct).contiguous();
  at::Tensor nbr = nbr_arg.contiguous(), masks = masks_arg.contiguous(), order = order_arg.contiguous();
  const int32_t* nb = nbr.const_data_ptr<int32_t>();
  check_fused_tables(nbr, order, features.size(0), map_info);
  at::Tensor out;  // in the output dtype, after each split
  for (int64_t s = 0; s < splits; ++s) {
    const int64_t k0 = s * kvol / splits, k1 = (s + 1) * kvol / splits;
    at::Tensor part = at::zeros({n_out, cout}, x.options());
    AT_DISPATCH_FLOATING_TYPES(ct, "fused_conv_cpu", [&] {
      fused_split<scalar_t>(x.const_data_ptr<scalar_t>(), w.const_data_ptr<scalar_t>(), nb,
                            masks.const_data_ptr<int32_t>() + s * n_out, order.const_data_ptr<int32_t>() + s * n_out,
                            n_out, kvol, cin, cout, k0, k1, part.mutable_data_ptr<scalar_t>());
    });
    out = s == 0 ? part.to(features.scalar_type()) : (out.to(ct) + part).to(features.scalar_type());
  }
  return out;
}

at::Tensor fused_conv_dfilter_cpu(const at::Tensor& features, const at::Tensor& out_grad, const at::Tensor& pair_in,
                                  const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                  const std::optional<at::Tensor>& map_info, bool /*tf32*/) {
  check_fused_dfilter_args(features, out_grad, pair_in, pair_out, pair_offsets, /*allow_double=*/true);
  const int64_t kvol = pair_offsets.size(0) - 1, cin = features.size(1), cout = out_grad.size(1);
  const auto ct = features.scalar_type() == at::kDouble ? at::kDouble : at::kFloat;
  at::Tensor x = features.to(ct), dy = out_grad.to(ct);
  at::Tensor po_t = pair_offsets.contiguous();
  const int64_t* po = po_t.const_data_ptr<int64_t>();
  check_pair_rows(pair_in, pair_out, po_t, x.size(0), dy.size(0), map_info);
  at::Tensor pin = pair_in.to(at::kLong), pout = pair_out.to(at::kLong);
  at::Tensor dw = at::zeros({kvol, cin, cout}, x.options());
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t b = po[k], n = po[k + 1] - b;
    if (n == 0) continue;
    at::Tensor a = x.index_select(0, pin.narrow(0, b, n));
    at::Tensor g = dy.index_select(0, pout.narrow(0, b, n));
    dw[k].copy_(at::mm(a.t(), g));
  }
  return dw.to(features.scalar_type());
}

// fused_conv_backward from its parts: the dinput tables (a mirrored map's with the columns reversed, masks and
// order made again) through fused_conv, and the dfilter table's pairs (column by column, rows ascending)
// through fused_conv_dfilter.
std::tuple<at::Tensor, at::Tensor> fused_conv_backward_cpu(
    const at::Tensor& features, const at::Tensor& filters, const at::Tensor& out_grad, const at::Tensor& nbr,
    const at::Tensor& masks, const at::Tensor& order, bool mirrored, const at::Tensor& dw_table, bool dw_by_output,
    const at::Tensor& pair_offsets, bool need_dx, bool need_dw, const std::optional<at::Tensor>& map_info,
    bool /*tf32*/) {
  check_fused_backward_args(features, filters, out_grad, nbr, masks, order, mirrored, dw_table, dw_by_output,
                            pair_offsets, need_dx, /*allow_double=*/true);
  check_fused_backward_tables(nbr, order, dw_table, dw_by_output, features.size(0), out_grad.size(0), need_dx,
                              need_dw, map_info);
  at::Tensor dx = at::empty({0}, features.options()), dw = at::empty({0}, features.options());
  if (need_dx) {
    at::Tensor wt = filters.transpose(1, 2).contiguous();
    if (mirrored) {
      at::Tensor rev = nbr.flip(1).contiguous();
      auto [m, o] = masks_and_order(rev, 1);
      dx = fused_conv_cpu(out_grad, wt, rev, m, o, std::nullopt, false);
    } else {
      dx = fused_conv_cpu(out_grad, wt, nbr, masks, order, std::nullopt, false);
    }
  }
  if (need_dw) {
    at::Tensor t = dw_table.t();
    at::Tensor hit = t.ge(0);
    at::Tensor at_rows = hit.nonzero().select(1, 1).to(at::kInt);  // (k, row) ascending
    at::Tensor entries = t.masked_select(hit);
    at::Tensor counts = hit.sum(1);
    at::Tensor po = at::cat({at::zeros({1}, counts.options()), counts.cumsum(0)});
    dw = dw_by_output ? fused_conv_dfilter_cpu(features, out_grad, entries, at_rows, po, std::nullopt, false)
                      : fused_conv_dfilter_cpu(features, out_grad, at_rows, entries, po, std::nullopt, false);
  }
  return {dx, dw};
}

std::string fused_conv_path_cpu(const at::Tensor&, bool) { return "reference"; }

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("build_fused_map", &build_fused_map_cpu);
  m.impl("fused_map_masks", &fused_map_masks_cpu);
  m.impl("fused_conv", &fused_conv_cpu);
  m.impl("fused_conv_dfilter", &fused_conv_dfilter_cpu);
  m.impl("fused_conv_backward", &fused_conv_backward_cpu);
  m.impl("fused_conv_path", &fused_conv_path_cpu);
}

}  // namespace ops
}  // namespace spconv
