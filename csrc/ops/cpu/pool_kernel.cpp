// CPU implementation of sparse max/avg pooling over a kernel map (native route).
// FP16/BF16 are computed in FP32 (exact for max) and returned in their dtype; the max pool forward also takes
// int8 features, pooled as int8 (inference).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../checks.h"
#include "../../native/pool.h"
#include "../output_cache.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType compute_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The pooling forwards' shared argument checks and operands: contiguous pairs (range-checked: they come from
// Python callers too), features in the compute type, and the output (uninitialised: the native loops start
// each row at zero while it is in cache, instead of a separate pass over the whole output).
struct PoolOperands {
  at::Tensor pin, pout, po, x, out;
};

PoolOperands pool_operands(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                           const at::Tensor& pair_offsets, int64_t num_out, const std::optional<at::Tensor>& map_info,
                           bool allow_int8 = false) {
  check_pool_args(features, pair_in, pair_out, pair_offsets, num_out, allow_int8);
  PoolOperands o{pair_in.contiguous(), pair_out.contiguous(), pair_offsets.contiguous(), {}, {}};
  check_pair_rows(o.pin, o.pout, o.po, features.size(0), num_out, map_info);
  const auto t = features.scalar_type();
  o.x = (t == at::kChar ? features : features.to(compute_type(t))).contiguous();
  o.out = empty_output({num_out, features.size(1)}, o.x.options());
  return o;
}

at::Tensor indice_maxpool_cpu(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                              const at::Tensor& pair_offsets, int64_t num_out, const std::optional<at::Tensor>& map_info) {
  auto [pin, pout, po, x, out] =
      pool_operands(features, pair_in, pair_out, pair_offsets, num_out, map_info, /*allow_int8=*/true);
  const auto ct = x.scalar_type();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kChar, ct, "indice_maxpool", [&] {
    native::maxpool_forward<scalar_t>(x.const_data_ptr<scalar_t>(), x.size(1), num_out,
                                      pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                      po.const_data_ptr<int64_t>(), po.size(0) - 1, out.mutable_data_ptr<scalar_t>());
  });
  return out.to(features.scalar_type());
}

at::Tensor indice_maxpool_backward_cpu(const at::Tensor& features, const at::Tensor& out_features,
                                       const at::Tensor& out_grad, const at::Tensor& pair_in,
                                       const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                       const std::optional<at::Tensor>& map_info) {
  check_maxpool_backward_args(features, out_features, out_grad, pair_in, pair_out, pair_offsets);
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  check_pair_rows(pin, pout, po, features.size(0), out_features.size(0), map_info);
  const auto ct = compute_type(features.scalar_type());
  at::Tensor x = features.to(ct).contiguous();
  at::Tensor y = out_features.to(ct).contiguous();
  at::Tensor dy = out_grad.to(ct).contiguous();
  at::Tensor dx = zeros_output(x.sizes(), x.options());
  AT_DISPATCH_FLOATING_TYPES(ct, "indice_maxpool_backward", [&] {
    native::maxpool_backward<scalar_t>(x.const_data_ptr<scalar_t>(), y.const_data_ptr<scalar_t>(),
                                       dy.const_data_ptr<scalar_t>(), x.size(1), x.size(0), y.size(0),
                                       pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                       po.const_data_ptr<int64_t>(), po.size(0) - 1,
                                       dx.mutable_data_ptr<scalar_t>());
  });
  return dx.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_avgpool_cpu(const at::Tensor& features, const at::Tensor& pair_in,
                                                      const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                                      int64_t num_out, const std::optional<at::Tensor>& map_info) {
  auto [pin, pout, po, x, out] = pool_operands(features, pair_in, pair_out, pair_offsets, num_out, map_info);
  const auto ct = x.scalar_type();
  at::Tensor count = at::zeros({num_out}, pair_in.options());
  AT_DISPATCH_FLOATING_TYPES(ct, "indice_avgpool", [&] {
    native::avgpool_forward<scalar_t>(x.const_data_ptr<scalar_t>(), x.size(1), num_out,
                                      pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                      po.const_data_ptr<int64_t>(), po.size(0) - 1,
                                      out.mutable_data_ptr<scalar_t>(), count.mutable_data_ptr<int32_t>());
  });
  return {out.to(features.scalar_type()), count};
}

at::Tensor indice_avgpool_backward_cpu(const at::Tensor& out_grad, const at::Tensor& count,
                                       const at::Tensor& pair_in, const at::Tensor& pair_out,
                                       const at::Tensor& pair_offsets, int64_t num_in, const std::optional<at::Tensor>& map_info) {
  check_avgpool_backward_args(out_grad, count, pair_in, pair_out, pair_offsets, num_in);
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  check_pair_rows(pin, pout, po, num_in, out_grad.size(0), map_info);
  at::Tensor cnt = count.contiguous();
  if (pin.numel()) {
    // Every output that a pair reaches has a count >= 1, else the division below would be by zero.
    TORCH_CHECK_VALUE(cnt.index_select(0, pout.to(at::kLong)).min().item<int32_t>() >= 1,
                      "count must be >= 1 for every output reached by a pair");
  }
  const auto ct = compute_type(out_grad.scalar_type());
  at::Tensor dy = out_grad.to(ct).contiguous();
  at::Tensor dx = zeros_output({num_in, out_grad.size(1)}, dy.options());
  AT_DISPATCH_FLOATING_TYPES(ct, "indice_avgpool_backward", [&] {
    native::avgpool_backward<scalar_t>(dy.const_data_ptr<scalar_t>(), cnt.const_data_ptr<int32_t>(), dy.size(1),
                                       num_in, pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                       po.const_data_ptr<int64_t>(), po.size(0) - 1,
                                       dx.mutable_data_ptr<scalar_t>());
  });
  return dx.to(out_grad.scalar_type());
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("indice_maxpool", &indice_maxpool_cpu);
  m.impl("indice_maxpool_backward", &indice_maxpool_backward_cpu);
  m.impl("indice_avgpool", &indice_avgpool_cpu);
  m.impl("indice_avgpool_backward", &indice_avgpool_backward_cpu);
}

}  // namespace ops
}  // namespace spconv
