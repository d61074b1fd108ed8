// GPU implementation of the native convolution route: per kernel offset, gather rows -> at::mm
// (cuBLAS / hipBLAS, FP32 output for 16-bit inputs) -> scatter-add into an fp32 (fp64 for double)
// accumulator. Offsets run in order
// on one stream, and within an offset a row appears once, so the scatter-add needs no atomics.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// out = a @ b accumulated and returned in out's dtype (FP32 for 16-bit a and b, never rounded to 16 bits in
// between, as on the CPU and fused routes). GPUs: the vendor GEMM reads 16-bit operands and writes FP32
// (mm.dtype_out). CPU tensors (the HIP CPU test build) have no such kernel: the operands are widened first.
void mm_acc(at::Tensor& out, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == out.scalar_type())
    at::mm_out(out, a, b);
  else if (a.is_cpu())
    at::mm_out(out, a.to(out.scalar_type()), b.to(out.scalar_type()));
  else
    at::mm_out(out, a, b, out.scalar_type());
}

// acc[scatter[p]] += src[gather[p]] @ (transpose_w ? W[k]^T : W[k]) over the pairs of each offset.
void gather_mm_scatter(const at::Tensor& src, const at::Tensor& w, bool transpose_w, const at::Tensor& gather,
                       const at::Tensor& scatter, const at::Tensor& offsets_cpu, at::Tensor& acc, void* stream) {
  const int64_t kvol = w.size(0), c_src = src.size(1), c_dst = acc.size(1);
  const int64_t* po = offsets_cpu.const_data_ptr<int64_t>();
  int64_t max_count = 0;
  for (int64_t k = 0; k < kvol; ++k) max_count = std::max(max_count, po[k + 1] - po[k]);
  if (max_count == 0 || c_dst == 0) return;
  const auto dt = gpu_dtype(src.scalar_type());
  at::Tensor a = at::empty({max_count, c_src}, src.options());
  at::Tensor o = at::empty({max_count, c_dst}, src.options().dtype(acc.scalar_type()));
  const int32_t* g = gather.const_data_ptr<int32_t>();
  const int32_t* s = scatter.const_data_ptr<int32_t>();
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t b = po[k], m = po[k + 1] - b;
    if (m == 0) continue;
    at::Tensor am = a.narrow(0, 0, m), om = o.narrow(0, 0, m);
    check_launch(gpu::gather_rows(dt, src.const_data_ptr(), c_src, g + b, m, am.mutable_data_ptr(), stream),
                 "gather_rows");
    mm_acc(om, am, transpose_w ? w[k].t() : w[k]);
    check_launch(gpu::scatter_add_rows(gpu_dtype(om.scalar_type()), om.const_data_ptr(), c_dst, s + b, m,
                                       gpu_dtype(acc.scalar_type()), acc.mutable_data_ptr(), stream),
                 "scatter_add_rows");
  }
}

at::Tensor indice_conv_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& pair_in,
                           const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_out,
                           const std::optional<at::Tensor>& map_info) {
  check_features(features, "features");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  check_filters(filters, features, pair_offsets.size(0) - 1);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be >= 0, got ", num_out);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), w = filters.contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = check_pair_rows(pin, pout, pair_offsets, x.size(0), num_out, map_info).offsets;
  at::Tensor acc = at::zeros({num_out, filters.size(2)}, x.options().dtype(acc_type(x.scalar_type())));
  if (x.size(0) > 0) gather_mm_scatter(x, w, /*transpose_w=*/false, pin, pout, po, acc, stream);
  return acc.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_conv_backward_gpu(const at::Tensor& features, const at::Tensor& filters,
                                                            const at::Tensor& out_grad, const at::Tensor& pair_in,
                                                            const at::Tensor& pair_out,
                                                            const at::Tensor& pair_offsets,
                                                            const std::optional<at::Tensor>& map_info) {
  check_conv_backward_args(features, filters, out_grad, pair_in, pair_out, pair_offsets);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), w = filters.contiguous(), dy = out_grad.contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = check_pair_rows(pin, pout, pair_offsets, x.size(0), dy.size(0), map_info).offsets;
  const int64_t kvol = w.size(0), cin = w.size(1), cout = w.size(2);
  at::Tensor dx_acc = at::zeros({x.size(0), cin}, x.options().dtype(acc_type(x.scalar_type())));
  if (dy.size(0) > 0) gather_mm_scatter(dy, w, /*transpose_w=*/true, pout, pin, po, dx_acc, stream);
  at::Tensor dw = at::zeros({kvol, cin, cout}, w.options());
  const int64_t* pop = po.const_data_ptr<int64_t>();
  int64_t max_count = 0;
  for (int64_t k = 0; k < kvol; ++k) max_count = std::max(max_count, pop[k + 1] - pop[k]);
  if (max_count > 0 && cin > 0 && cout > 0) {
    const auto dt = gpu_dtype(x.scalar_type());
    at::Tensor a = at::empty({max_count, cin}, x.options()), b = at::empty({max_count, cout}, x.options());
    at::Tensor dwk_acc = at::empty({cin, cout}, x.options().dtype(acc_type(x.scalar_type())));
    for (int64_t k = 0; k < kvol; ++k) {
      const int64_t s = pop[k], m = pop[k + 1] - s;
      if (m == 0) continue;
      at::Tensor am = a.narrow(0, 0, m), bm = b.narrow(0, 0, m);
      check_launch(gpu::gather_rows(dt, x.const_data_ptr(), cin, pin.const_data_ptr<int32_t>() + s, m,
                                    am.mutable_data_ptr(), stream),
                   "gather_rows");
      check_launch(gpu::gather_rows(dt, dy.const_data_ptr(), cout, pout.const_data_ptr<int32_t>() + s, m,
                                    bm.mutable_data_ptr(), stream),
                   "gather_rows");
      mm_acc(dwk_acc, am.t(), bm);
      dw[k].copy_(dwk_acc);  // rounded once
    }
  }
  return {dx_acc.to(features.scalar_type()), dw};
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("indice_conv", &indice_conv_gpu);
  m.impl("indice_conv_backward", &indice_conv_backward_gpu);
}

}  // namespace ops
}  // namespace spconv
