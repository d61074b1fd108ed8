// GPU glue of sparse max/avg pooling (kernels in csrc/hip/pool.cu): same checks, dtypes and results as the
// CPU glue (csrc/ops/cpu/pool_kernel.cpp). FP16/BF16 features are read as they are and computed in FP32;
// results come back in the input's dtype. The max pooling forward also takes int8 features (exact).
#include <ATen/ATen.h>
#include <torch/library.h>


#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The shared pair checks: with map_info on the host alone; else one device->host copy, which for the avg
// backward also fetches the smallest count a pair reaches. Returns the host copy of pair_offsets that the
// launchers walk.
at::Tensor checked_host_offsets(const at::Tensor& pin, const at::Tensor& pout, const at::Tensor& pair_offsets,
                                int64_t num_in, int64_t num_out, const std::optional<at::Tensor>& map_info,
                                const at::Tensor* count = nullptr) {
  if (map_info.has_value() && map_info->defined())  // count is trusted with the map (checks.h)
    return check_pair_rows(pin, pout, pair_offsets, num_in, num_out, map_info).offsets;
  const bool with_count = count != nullptr && pin.size(0) > 0 && count->size(0) > 0;
  at::Tensor smallest;
  if (with_count) {
    // Clamped so that an out-of-range pair_out cannot trip a device-side assert before the range check
    // rejects it; once that check passes the clamp changes nothing.
    at::Tensor rows = pout.to(at::kLong).clamp(0, count->size(0) - 1);
    smallest = count->index_select(0, rows).min().reshape({1});
  }
  HostPairOffsets host = check_pair_rows(pin, pout, pair_offsets, num_in, num_out, std::nullopt, smallest);
  if (count != nullptr && pin.size(0) > 0)  // every output a pair reaches needs count >= 1: the backward divides
    TORCH_CHECK_VALUE(with_count && host.extra.const_data_ptr<int64_t>()[0] >= 1,
                      "count must be >= 1 for every output reached by a pair");
  return host.offsets;
}

at::Tensor indice_maxpool_gpu(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                              const at::Tensor& pair_offsets, int64_t num_out, const std::optional<at::Tensor>& map_info) {
  check_pool_args(features, pair_in, pair_out, pair_offsets, num_out, /*allow_int8=*/true);
  const bool int8 = features.scalar_type() == at::kChar;
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), num_out, map_info);
  at::Tensor x = features.contiguous();
  // Max only selects, so the output can stay in the storage dtype: equal to computing in FP32 and rounding.
  at::Tensor out = at::zeros({num_out, x.size(1)}, x.options());
  if (int8) {
    check_launch(gpu::maxpool_forward_int8(x.const_data_ptr<int8_t>(), x.size(1), pin.const_data_ptr<int32_t>(),
                                           pout.const_data_ptr<int32_t>(), po.const_data_ptr<int64_t>(),
                                           po.size(0) - 1, out.mutable_data_ptr<int8_t>(),
                                           current_stream(features.device())),
                 "maxpool_forward_int8");
    return out;
  }
  check_launch(gpu::maxpool_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), x.size(1),
                                    pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                    po.const_data_ptr<int64_t>(), po.size(0) - 1, out.mutable_data_ptr(),
                                    current_stream(features.device())),
               "maxpool_forward");
  return out;
}

at::Tensor indice_maxpool_backward_gpu(const at::Tensor& features, const at::Tensor& out_features,
                                       const at::Tensor& out_grad, const at::Tensor& pair_in,
                                       const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                       const std::optional<at::Tensor>& map_info) {
  check_maxpool_backward_args(features, out_features, out_grad, pair_in, pair_out, pair_offsets);
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), out_features.size(0), map_info);
  // The kernel reads one dtype. Mixed dtypes (not what autograd passes) go through the compute type, exactly
  // as the CPU glue converts each of them.
  const auto t = features.scalar_type();
  const bool same = out_features.scalar_type() == t && out_grad.scalar_type() == t;
  const auto kt = same ? t : acc_type(t);
  at::Tensor x = features.to(kt).contiguous(), y = out_features.to(kt).contiguous();
  at::Tensor dy = out_grad.to(kt).contiguous();
  const int64_t c = x.size(1);
  at::Tensor claimed = at::zeros({y.size(0) * c}, x.options().dtype(at::kByte));
  at::Tensor dx = at::zeros({x.size(0), c}, x.options().dtype(acc_type(kt)));
  check_launch(gpu::maxpool_backward(gpu_dtype(kt), x.const_data_ptr(), y.const_data_ptr(), dy.const_data_ptr(), c,
                                     pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                     po.const_data_ptr<int64_t>(), po.size(0) - 1,
                                     claimed.mutable_data_ptr<uint8_t>(), dx.mutable_data_ptr(),
                                     current_stream(features.device())),
               "maxpool_backward");
  return dx.to(t);
}

std::tuple<at::Tensor, at::Tensor> indice_avgpool_gpu(const at::Tensor& features, const at::Tensor& pair_in,
                                                      const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                                      int64_t num_out, const std::optional<at::Tensor>& map_info) {
  check_pool_args(features, pair_in, pair_out, pair_offsets, num_out);
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), num_out, map_info);
  at::Tensor x = features.contiguous();
  at::Tensor acc = at::zeros({num_out, x.size(1)}, x.options().dtype(acc_type(x.scalar_type())));
  at::Tensor count = at::zeros({num_out}, pin.options());
  check_launch(gpu::avgpool_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), x.size(1), num_out,
                                    pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                    po.const_data_ptr<int64_t>(), po.size(0) - 1, acc.mutable_data_ptr(),
                                    count.mutable_data_ptr<int32_t>(), current_stream(features.device())),
               "avgpool_forward");
  return {acc.to(features.scalar_type()), count};
}

at::Tensor indice_avgpool_backward_gpu(const at::Tensor& out_grad, const at::Tensor& count,
                                       const at::Tensor& pair_in, const at::Tensor& pair_out,
                                       const at::Tensor& pair_offsets, int64_t num_in, const std::optional<at::Tensor>& map_info) {
  check_avgpool_backward_args(out_grad, count, pair_in, pair_out, pair_offsets, num_in);
  c10::DeviceGuard guard(out_grad.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), cnt = count.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, num_in, out_grad.size(0), map_info, &cnt);
  at::Tensor dy = out_grad.contiguous();
  at::Tensor dx = at::zeros({num_in, dy.size(1)}, dy.options().dtype(acc_type(dy.scalar_type())));
  check_launch(gpu::avgpool_backward(gpu_dtype(dy.scalar_type()), dy.const_data_ptr(), cnt.const_data_ptr<int32_t>(),
                                     dy.size(1), pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                     po.const_data_ptr<int64_t>(), po.size(0) - 1, dx.mutable_data_ptr(),
                                     current_stream(out_grad.device())),
               "avgpool_backward");
  return dx.to(out_grad.scalar_type());
}

}  // namespace

// ROCm builds of torch register HIP devices under the CUDA dispatch key too.
SPCONV_GPU_IMPL(m) {
  m.impl("indice_maxpool", &indice_maxpool_gpu);
  m.impl("indice_maxpool_backward", &indice_maxpool_backward_gpu);
  m.impl("indice_avgpool", &indice_avgpool_gpu);
  m.impl("indice_avgpool_backward", &indice_avgpool_backward_gpu);
}

}  // namespace ops
}  // namespace spconv
