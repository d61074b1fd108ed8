// CPU implementation of the native convolution route (forward, dinput, dfilter).
// FP16/BF16 are computed in FP32 and returned in their dtype; FP32 and FP64 compute natively.
#include <ATen/ATen.h>
#include <algorithm>
#include <torch/library.h>

#include "../checks.h"
#include "../../native/gather_gemm_scatter.h"
#include "../output_cache.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor indice_conv_cpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& pair_in,
                           const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_out,
                           const std::optional<at::Tensor>& map_info,
                           const std::optional<at::Tensor>& /*out_positions: GPU route only*/,
                           const std::optional<at::Tensor>& /*in_positions*/) {
  check_features(features, "features");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  check_filters(filters, features, pair_offsets.size(0) - 1);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be >= 0, got ", num_out);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous();
  at::Tensor w = filters.to(ct).contiguous();
  at::Tensor out = empty_output({num_out, filters.size(2)}, x.options());  // every row is written
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  check_pair_rows(pin, pout, po, x.size(0), num_out, map_info);
  native::gather_gemm_scatter(x, w, /*transpose_w=*/false, pin.const_data_ptr<int32_t>(),
                              pout.const_data_ptr<int32_t>(), po.const_data_ptr<int64_t>(), out);
  return out.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_conv_backward_cpu(const at::Tensor& features, const at::Tensor& filters,
                                                            const at::Tensor& out_grad, const at::Tensor& pair_in,
                                                            const at::Tensor& pair_out,
                                                            const at::Tensor& pair_offsets,
                                                            const std::optional<at::Tensor>& map_info,
                                                            const std::optional<at::Tensor>& /*in_positions*/) {
  check_conv_backward_args(features, filters, out_grad, pair_in, pair_out, pair_offsets);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous();
  at::Tensor w = filters.to(ct).contiguous();
  at::Tensor dy = out_grad.to(ct).contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  const bool mirrored = check_pair_rows(pin, pout, po, x.size(0), dy.size(0), map_info).mirrored;
  at::Tensor dx = empty_output(x.sizes(), x.options());  // every row is written
  at::Tensor dw = at::empty_like(w);
  native::gather_gemm_scatter_backward(x, w, dy, pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                       po.const_data_ptr<int64_t>(), dx, dw, mirrored);
  return {dx.to(features.scalar_type()), dw.to(filters.scalar_type())};
}

// The GPU route's table, made here too so that the op runs on every device (the CPU route does not read it).
at::Tensor pair_positions_cpu(const at::Tensor& pair_dst, const at::Tensor& pair_offsets, int64_t num_dst) {
  check_pair_positions_args(pair_dst, pair_offsets, num_dst);
  const int64_t kvol = pair_offsets.size(0) - 1;
  const at::Tensor dst = pair_dst.contiguous(), po = pair_offsets.contiguous();
  at::Tensor pos = at::full({num_dst, kvol}, -1, dst.options());
  const int32_t* d = dst.const_data_ptr<int32_t>();
  const int64_t* o = po.const_data_ptr<int64_t>();
  int32_t* out = pos.mutable_data_ptr<int32_t>();
  for (int64_t k = 0; k < kvol; ++k)
    for (int64_t p = std::max<int64_t>(o[k], 0); p < std::min(o[k + 1], dst.size(0)); ++p)
      if (d[p] >= 0 && d[p] < num_dst) out[d[p] * kvol + k] = static_cast<int32_t>(p - o[k]);
  return pos;
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("indice_conv", &indice_conv_cpu);
  m.impl("indice_conv_backward", &indice_conv_backward_cpu);
  m.impl("pair_positions", &pair_positions_cpu);
}

}  // namespace ops
}  // namespace spconv
