// GPU glue of the grouped-convolution ops. Over neighbour tables (grouped_conv*): the direct kernels of
// csrc/hip/grouped_conv.cu (the fused route for groups > 1). Over pairs (indice_conv_grouped*, the native GPU
// route): per kernel offset, gather rows -> per-group batched GEMM (vendor BLAS through ATen) -> scatter-add
// into an FP32 (FP64) accumulator, offsets in order on one stream; within an offset a row appears once, so
// the scatter needs no atomics.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "../checks.h"
#include "../grouped_checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// Entries of a table in [-1, n_src): bounded by map_info on the host, else one device->host copy of two
// numbers, so a bad table raises instead of being read (as the fused route checks its tables).
void check_table_range(const at::Tensor& table, const char* name, int64_t n_src, const std::optional<at::Tensor>& map_info, bool reversed) {
  if (table_rows_bounded(table, n_src, map_info, reversed) || table.numel() == 0) return;
  auto mm = at::aminmax(table);
  const at::Tensor h = to_host(at::stack({std::get<0>(mm), std::get<1>(mm)}).to(at::kLong));
  const int64_t* v = h.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(v[0] >= -1 && v[1] < n_src, name, " holds rows outside [-1, ", n_src, ") (the rows it indexes): "
                    "min ", v[0], ", max ", v[1]);
}

at::Tensor forward_table(const at::Tensor& x, const at::Tensor& w, const at::Tensor& table, void* stream) {
  const int64_t n_rows = table.size(0), kvol = table.size(1), G = w.size(1), cig = w.size(2), cog = w.size(3);
  at::Tensor y = at::empty({n_rows, G * cog}, x.options());
  check_launch(gpu::grouped_conv_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                                         table.const_data_ptr<int32_t>(), n_rows, kvol, x.size(0), G, cig, cog,
                                         y.mutable_data_ptr(), stream),
               "grouped_conv_forward");
  return y;
}

at::Tensor grouped_conv_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                            const at::Tensor& nbr_t, const std::optional<at::Tensor>& map_info) {
  check_grouped_conv_args(features, filters, nbr, nbr_t);
  c10::DeviceGuard guard(features.device());
  at::Tensor x = features.contiguous(), w = filters.contiguous(), nb = nbr.contiguous();
  check_table_range(nb, "nbr", x.size(0), map_info, /*reversed=*/false);
  return forward_table(x, w, nb, current_stream(features.device()));
}

std::tuple<at::Tensor, at::Tensor> grouped_conv_backward_gpu(const at::Tensor& features, const at::Tensor& filters,
                                                             const at::Tensor& out_grad, const at::Tensor& nbr_t,
                                                             const std::optional<at::Tensor>& map_info) {
  check_grouped_backward_args(features, filters, out_grad, nbr_t);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), dy = out_grad.contiguous(), nb = nbr_t.contiguous();
  check_table_range(nb, "nbr_t", dy.size(0), map_info, /*reversed=*/true);
  // dX: the forward over the reversed table with each group's filter transposed.
  at::Tensor dx = forward_table(dy, filters.transpose(2, 3).contiguous(), nb, stream);
  const int64_t n_in = x.size(0), kvol = nb.size(1), G = filters.size(1), cig = filters.size(2), cog = filters.size(3);
  at::Tensor dw = at::empty(filters.sizes(), x.options());
  const int64_t numel = dw.numel();
  if (numel == 0) return {dx, dw};
  // Splits of the input rows: enough threads to fill a device, a bounded workspace; sizes only, so the bits
  // don't depend on the device.
  const int64_t splits = std::clamp<int64_t>(std::min<int64_t>(n_in / 256, (int64_t{1} << 22) / numel), 1, 1024);
  at::Tensor ws = at::empty({splits * numel}, x.options().dtype(acc_type(x.scalar_type())));
  check_launch(gpu::grouped_conv_dfilter(gpu_dtype(x.scalar_type()), x.const_data_ptr(), dy.const_data_ptr(),
                                         nb.const_data_ptr<int32_t>(), n_in, kvol, dy.size(0), G, cig, cog, splits,
                                         ws.mutable_data_ptr(), dw.mutable_data_ptr(), stream),
               "grouped_conv_dfilter");
  return {dx, dw};
}

// ---- over pairs: gather -> batched GEMM per group -> scatter-add ----

// [m, G*ca] rows times per-group [G, ca, cb] -> [m, G*cb], in the accumulator dtype.
at::Tensor group_mm(const at::Tensor& rows, const at::Tensor& w_acc) {
  const int64_t m = rows.size(0), G = w_acc.size(0), ca = w_acc.size(1), cb = w_acc.size(2);
  at::Tensor a = rows.to(w_acc.scalar_type()).view({m, G, ca}).transpose(0, 1);  // [G, m, ca]
  return at::bmm(a, w_acc).transpose(0, 1).contiguous().view({m, G * cb});
}

// acc[scatter[p]] += src[gather[p]] @ w_acc[k] per group, over the pairs of each offset (w_acc [kvol, G, ca, cb]).
void gather_group_mm_scatter(const at::Tensor& src, const at::Tensor& w_acc, const at::Tensor& gather,
                             const at::Tensor& scatter, const at::Tensor& offsets_cpu, at::Tensor& acc, void* stream) {
  const int64_t kvol = w_acc.size(0), c_src = src.size(1), c_dst = acc.size(1);
  const int64_t* po = offsets_cpu.const_data_ptr<int64_t>();
  int64_t max_count = 0;
  for (int64_t k = 0; k < kvol; ++k) max_count = std::max(max_count, po[k + 1] - po[k]);
  if (max_count == 0 || c_dst == 0 || c_src == 0) return;
  const auto dt = gpu_dtype(src.scalar_type());
  at::Tensor a = at::empty({max_count, c_src}, src.options());
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t b = po[k], m = po[k + 1] - b;
    if (m == 0) continue;
    at::Tensor am = a.narrow(0, 0, m);
    check_launch(gpu::gather_rows(dt, src.const_data_ptr(), c_src, gather.const_data_ptr<int32_t>() + b, m,
                                  am.mutable_data_ptr(), stream),
                 "gather_rows");
    at::Tensor o = group_mm(am, w_acc[k]);
    check_launch(gpu::scatter_add_rows(gpu_dtype(o.scalar_type()), o.const_data_ptr(), c_dst,
                                       scatter.const_data_ptr<int32_t>() + b, m, gpu_dtype(acc.scalar_type()),
                                       acc.mutable_data_ptr(), stream),
                 "scatter_add_rows");
  }
}

at::Tensor indice_conv_grouped_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& pair_in,
                                   const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_out,
                                   const std::optional<at::Tensor>& map_info) {
  check_indice_conv_grouped_args(features, filters, pair_in, pair_out, pair_offsets, num_out);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_pair_offsets(pin, pout, pair_offsets, x.size(0), num_out, map_info);
  const auto at_ = acc_type(x.scalar_type());
  at::Tensor acc = at::zeros({num_out, filters.size(1) * filters.size(3)}, x.options().dtype(at_));
  gather_group_mm_scatter(x, filters.to(at_).contiguous(), pin, pout, po, acc, stream);
  return acc.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_conv_grouped_backward_gpu(const at::Tensor& features,
                                                                    const at::Tensor& filters,
                                                                    const at::Tensor& out_grad,
                                                                    const at::Tensor& pair_in,
                                                                    const at::Tensor& pair_out,
                                                                    const at::Tensor& pair_offsets,
                                                                    const std::optional<at::Tensor>& map_info) {
  check_indice_conv_grouped_backward_args(features, filters, out_grad, pair_in, pair_out, pair_offsets);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), dy = out_grad.contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_pair_offsets(pin, pout, pair_offsets, x.size(0), dy.size(0), map_info);
  const auto at_ = acc_type(x.scalar_type());
  const int64_t kvol = filters.size(0), G = filters.size(1), cig = filters.size(2), cog = filters.size(3);
  at::Tensor dx = at::zeros({x.size(0), G * cig}, x.options().dtype(at_));
  gather_group_mm_scatter(dy, filters.to(at_).transpose(2, 3).contiguous(), pout, pin, po, dx, stream);
  at::Tensor dw = at::zeros({kvol, G, cig, cog}, x.options().dtype(at_));
  const int64_t* pop = po.const_data_ptr<int64_t>();
  int64_t max_count = 0;
  for (int64_t k = 0; k < kvol; ++k) max_count = std::max(max_count, pop[k + 1] - pop[k]);
  if (max_count > 0 && dw.numel() > 0) {
    const auto dt = gpu_dtype(x.scalar_type());
    at::Tensor a = at::empty({max_count, G * cig}, x.options()), b = at::empty({max_count, G * cog}, x.options());
    for (int64_t k = 0; k < kvol; ++k) {
      const int64_t s = pop[k], m = pop[k + 1] - s;
      if (m == 0) continue;
      at::Tensor am = a.narrow(0, 0, m), bm = b.narrow(0, 0, m);
      check_launch(gpu::gather_rows(dt, x.const_data_ptr(), G * cig, pin.const_data_ptr<int32_t>() + s, m,
                                    am.mutable_data_ptr(), stream),
                   "gather_rows");
      check_launch(gpu::gather_rows(dt, dy.const_data_ptr(), G * cog, pout.const_data_ptr<int32_t>() + s, m,
                                    bm.mutable_data_ptr(), stream),
                   "gather_rows");
      // [G, cig, m] @ [G, m, cog] per group.
      at::Tensor xa = am.to(at_).view({m, G, cig}).permute({1, 2, 0});
      at::Tensor ga = bm.to(at_).view({m, G, cog}).transpose(0, 1);
      dw[k].copy_(at::bmm(xa, ga));
    }
  }
  return {dx.to(features.scalar_type()), dw.to(filters.scalar_type())};
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("grouped_conv", &grouped_conv_gpu);
  m.impl("grouped_conv_backward", &grouped_conv_backward_gpu);
  m.impl("indice_conv_grouped", &indice_conv_grouped_gpu);
  m.impl("indice_conv_grouped_backward", &indice_conv_grouped_backward_gpu);
}

}  // namespace ops
}  // namespace spconv
