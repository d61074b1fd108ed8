// GPU glue of the int8 ops (kernel in csrc/hip/quantized_conv.cu): the shared checks once, the operands packed
// into 4-byte words along Cin (so the kernel's loads are aligned words whatever Cin is), one launch. With
// map_info the table is bounded on the host: no device->host copy.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "../checks.h"
#include "../op_library.h"
#include "../quantized_checks.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

int64_t words_of(int64_t cin) { return (cin + 3) / 4; }

// t int8 [..., 4 * m] as int32 [..., m]: a view where t's rows are plain and word-aligned, else a fresh copy
// (contiguous() may keep odd strides on size-1 dimensions, which a dtype view refuses).
at::Tensor as_words(const at::Tensor& t) {
  bool plain = t.storage_offset() % 4 == 0;
  for (int64_t d = t.dim() - 1, expect = 1; d >= 0; expect *= t.size(d), --d) plain = plain && t.stride(d) == expect;
  const at::Tensor b = plain ? t : at::empty(t.sizes(), t.options()).copy_(t);
  return b.view(at::kInt);
}

// features int8 [n, cin] -> int32 [n, k4], 4 channels per word (little-endian: channel 4w in the low byte).
at::Tensor pack_rows(const at::Tensor& features) {
  const int64_t cin = features.size(1), pad = words_of(cin) * 4 - cin;
  return as_words(pad > 0 ? at::constant_pad_nd(features, {0, pad}) : features);
}

// filters int8 [kvol, cin, cout] -> int32 [kvol, k4, cout]: word (k, w, c) holds filters[k, 4w..4w+3, c].
at::Tensor pack_filters(const at::Tensor& filters) {
  const int64_t kvol = filters.size(0), cin = filters.size(1), cout = filters.size(2), k4 = words_of(cin);
  at::Tensor w = k4 * 4 > cin ? at::constant_pad_nd(filters, {0, 0, 0, k4 * 4 - cin}) : filters;
  return as_words(w.reshape({kvol, k4, 4, cout}).permute({0, 1, 3, 2})).reshape({kvol, k4, cout});
}

at::Tensor quantized_conv_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                              const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, double residual_scale, int64_t activation,
                              double alpha, const std::optional<at::Tensor>& map_info) {
  check_quantized_conv_args(features, filters, nbr, scale, bias, residual, activation);
  c10::DeviceGuard guard(features.device());
  const int64_t kvol = filters.size(0), cout = filters.size(2), n_out = nbr.size(0);
  at::Tensor nb = nbr.contiguous();
  check_quantized_table_rows(nb, kvol, features.size(0), map_info);
  at::Tensor y = at::empty({n_out, cout}, features.options());
  if (n_out == 0 || cout == 0) return y;
  at::Tensor x = pack_rows(features), w = pack_filters(filters), sc = scale.contiguous();
  at::Tensor b = bias ? bias->contiguous() : at::Tensor(), r = residual ? residual->contiguous() : at::Tensor();
  check_launch(gpu::quantized_conv_forward(
                   x.const_data_ptr<int32_t>(), x.size(0), x.size(1), w.const_data_ptr<int32_t>(), kvol, cout,
                   nb.const_data_ptr<int32_t>(), n_out, nb.size(1), sc.const_data_ptr<float>(),
                   b.defined() ? b.const_data_ptr<float>() : nullptr, r.defined() ? r.const_data_ptr<int8_t>() : nullptr,
                   static_cast<float>(residual_scale), static_cast<int>(activation), static_cast<float>(alpha),
                   y.mutable_data_ptr<int8_t>(), current_stream(features.device())),
               "quantized_conv_forward");
  return y;
}

std::string quantized_conv_path_gpu(const at::Tensor& features) {
  c10::DeviceGuard guard(features.device());
  at::Tensor body = at::empty({1}, features.options().dtype(at::kInt));
  check_launch(gpu::quantized_conv_body(body.mutable_data_ptr<int32_t>(), current_stream(features.device())),
               "quantized_conv_body");
  return gpu::quantized_body_name(to_host(body).item<int32_t>());
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("quantized_conv", &quantized_conv_gpu);
  m.impl("quantized_conv_path", &quantized_conv_path_gpu);
}

}  // namespace ops
}  // namespace spconv
