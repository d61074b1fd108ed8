// CPU implementation of the int8 inference ops (csrc/native/int8_conv.h): the arguments are checked once here,
// the kernel reads raw contiguous buffers.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <string>

#include "../quantized_checks.h"
#include "../../native/int8_conv.h"
#include "../output_cache.h"

namespace spconv {
namespace ops {
namespace {

at::Tensor quantized_conv_cpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                              const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                              const std::optional<at::Tensor>& residual, double residual_scale, int64_t activation,
                              double alpha, const std::optional<at::Tensor>& map_info) {
  check_quantized_conv_args(features, filters, nbr, scale, bias, residual, activation);
  check_quantized_table_rows(nbr, filters.size(0), features.size(0), map_info);
  const at::Tensor x = features.contiguous(), w = filters.contiguous(), nb = nbr.contiguous();
  const at::Tensor sc = scale.contiguous();
  const at::Tensor b = bias ? bias->contiguous() : at::Tensor();
  const at::Tensor res = residual ? residual->contiguous() : at::Tensor();
  at::Tensor out = empty_output({nb.size(0), w.size(2)}, x.options());
  if (out.numel() == 0) return out;
  native::Int8Conv a;
  a.x = x.const_data_ptr<int8_t>();
  a.num_in = x.size(0);
  a.cin = x.size(1);
  a.w = w.const_data_ptr<int8_t>();
  a.kvol = w.size(0);
  a.cout = w.size(2);
  a.nbr = nb.const_data_ptr<int32_t>();
  a.num_out = nb.size(0);
  a.cols = nb.size(1);
  a.scale = sc.const_data_ptr<float>();
  a.bias = b.defined() ? b.const_data_ptr<float>() : nullptr;
  a.residual = res.defined() ? res.const_data_ptr<int8_t>() : nullptr;
  a.residual_scale = static_cast<float>(residual_scale);
  a.activation = static_cast<int>(activation);
  a.alpha = static_cast<float>(alpha);
  a.out = out.mutable_data_ptr<int8_t>();
  // The kernel also bounds every entry it reads (map_info is trusted to describe nbr, not relied on for safety).
  TORCH_CHECK_VALUE(native::int8_conv(a), "nbr entries must be -1 or an input row in [0, ", a.num_in,
                    "), but some are not (is map_info the map nbr was built from?)");
  return out;
}

std::string quantized_conv_path_cpu(const at::Tensor& features) {
  (void)features;
  return native::int8_path_name(native::int8_conv_path());
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("quantized_conv", &quantized_conv_cpu);
  m.impl("quantized_conv_path", &quantized_conv_path_cpu);
}

}  // namespace ops
}  // namespace spconv
