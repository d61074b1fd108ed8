// Argument checks of the int8 ops (quantized_conv), shared by the CPU and GPU glue (header-only, like
// grouped_checks.h). Messages name the argument.
#pragma once
#include <ATen/ATen.h>

#include <optional>

#include "checks.h"

namespace spconv {
namespace ops {

// The int32 sum of one output element is exact below this many products (|int8 x int8| <= 2^14).
constexpr int64_t kQuantizedMaxProducts = int64_t(1) << 17;

enum class QuantizedActivation : int64_t { kNone = 0, kReLU = 1, kLeakyReLU = 2 };

// features int8 [num_in, Cin], filters int8 [kvol, Cin, Cout], nbr int32 [num_out, T] (T a multiple of kvol),
// scale float32 [Cout], bias float32 [Cout] or none, residual int8 [num_out, Cout] or none, all on one device.
inline void check_quantized_conv_args(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr,
                                      const at::Tensor& scale, const std::optional<at::Tensor>& bias,
                                      const std::optional<at::Tensor>& residual, int64_t activation) {
  TORCH_CHECK_TYPE(features.scalar_type() == at::kChar, "features must be int8, got ", features.scalar_type());
  TORCH_CHECK_VALUE(features.dim() == 2, "features must be [num_in, Cin], got ", features.sizes());
  TORCH_CHECK_TYPE(filters.scalar_type() == at::kChar, "filters must be int8, got ", filters.scalar_type());
  TORCH_CHECK_VALUE(filters.dim() == 3 && filters.size(0) >= 1 && filters.size(1) == features.size(1),
                    "filters must be [kvol, Cin=", features.size(1), ", Cout], got ", filters.sizes());
  TORCH_CHECK_TYPE(nbr.scalar_type() == at::kInt, "nbr must be int32, got ", nbr.scalar_type());
  TORCH_CHECK_VALUE(nbr.dim() == 2 && nbr.size(1) >= 1 && nbr.size(1) % filters.size(0) == 0,
                    "nbr must be [num_out, T] with T a multiple of the kernel volume ", filters.size(0), ", got ",
                    nbr.sizes());
  TORCH_CHECK_VALUE(nbr.size(1) * features.size(1) < kQuantizedMaxProducts, "nbr columns x Cin = ",
                    nbr.size(1), " x ", features.size(1), " exceeds the ", kQuantizedMaxProducts - 1,
                    " products an int32 sum holds exactly");
  const int64_t cout = filters.size(2);
  TORCH_CHECK_TYPE(scale.scalar_type() == at::kFloat, "scale must be float32, got ", scale.scalar_type());
  TORCH_CHECK_VALUE(scale.dim() == 1 && scale.size(0) == cout, "scale must be [Cout=", cout, "], got ",
                    scale.sizes());
  if (bias) {
    TORCH_CHECK_TYPE(bias->scalar_type() == at::kFloat, "bias must be float32, got ", bias->scalar_type());
    TORCH_CHECK_VALUE(bias->dim() == 1 && bias->size(0) == cout, "bias must be [Cout=", cout, "], got ",
                      bias->sizes());
  }
  if (residual) {
    TORCH_CHECK_TYPE(residual->scalar_type() == at::kChar, "residual must be int8, got ", residual->scalar_type());
    TORCH_CHECK_VALUE(residual->dim() == 2 && residual->size(0) == nbr.size(0) && residual->size(1) == cout,
                      "residual must be [num_out=", nbr.size(0), ", Cout=", cout, "], got ", residual->sizes());
  }
  TORCH_CHECK_VALUE(activation >= 0 && activation <= 2, "activation must be 0 (none), 1 (ReLU) or 2 (LeakyReLU), got ",
                    activation);
  const auto dev = features.device();
  for (const auto& [t, name] : {std::pair<const at::Tensor*, const char*>{&filters, "filters"}, {&nbr, "nbr"},
                                {&scale, "scale"}, {bias ? &*bias : nullptr, "bias"},
                                {residual ? &*residual : nullptr, "residual"}}) {
    if (t != nullptr) {
      TORCH_CHECK_VALUE(t->device() == dev, name, " is on ", t->device(), " but features on ", dev);
    }
  }
}

// Every nbr entry is -1 or an input row: on the host from map_info (the map nbr was built from), else from nbr's
// extremes (one device->host copy for a GPU table).
inline void check_quantized_table_rows(const at::Tensor& nbr, int64_t kvol, int64_t num_in,
                                       const std::optional<at::Tensor>& map_info) {
  if (const auto info = read_map_info(map_info, kvol, /*npairs=*/-1)) {
    TORCH_CHECK_VALUE(info->in_rows <= num_in, "map_info says nbr indexes ", info->in_rows,
                      " input rows, but features have ", num_in);
    return;
  }
  if (nbr.numel() == 0) return;
  const at::Tensor ext = to_host(at::stack({nbr.min(), nbr.max()}).to(at::kLong));
  const int64_t lo = ext[0].item<int64_t>(), hi = ext[1].item<int64_t>();
  TORCH_CHECK_VALUE(lo >= -1 && hi < num_in, "nbr entries must be -1 or an input row in [0, ", num_in,
                    "), found the range [", lo, ", ", hi, "]");
}

}  // namespace ops
}  // namespace spconv
