#include "hash_checks.h"

#include "checks.h"

namespace spconv {
namespace ops {

HashInput hash_input(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys,
                     const at::Tensor* values) {
  check_hash_keys(table_keys, table_values, keys, values);
  const at::Tensor k = keys.contiguous();
  return {k, values ? values->contiguous() : at::Tensor()};
}

void check_hash_table(const at::Tensor& table_keys, const at::Tensor& table_values) {
  TORCH_CHECK_TYPE(table_keys.scalar_type() == at::kInt || table_keys.scalar_type() == at::kLong,
                   "table_keys must be int32 or int64, got ", table_keys.scalar_type());
  const auto vt = table_values.scalar_type();
  TORCH_CHECK_TYPE(vt == at::kInt || vt == at::kLong || vt == at::kFloat || vt == at::kDouble,
                   "table_values must be int32, int64, float32 or float64, got ", vt);
  TORCH_CHECK_VALUE(table_keys.dim() == 1 && table_keys.size(0) >= 1 && table_keys.is_contiguous(),
                    "table_keys must be a contiguous non-empty 1-D tensor, got ", table_keys.sizes());
  TORCH_CHECK_VALUE(table_values.dim() == 1 && table_values.size(0) == table_keys.size(0) &&
                        table_values.is_contiguous(),
                    "table_values must be contiguous 1-D of table_keys' length ", table_keys.size(0), ", got ",
                    table_values.sizes());
  TORCH_CHECK_VALUE(table_values.device() == table_keys.device(), "table_values is on ", table_values.device(),
                    " but table_keys on ", table_keys.device());
}

void check_hash_keys(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys,
                     const at::Tensor* values) {
  check_hash_table(table_keys, table_values);
  TORCH_CHECK_TYPE(keys.scalar_type() == table_keys.scalar_type(), "keys must have the table's key dtype ",
                   table_keys.scalar_type(), ", got ", keys.scalar_type());
  TORCH_CHECK_VALUE(keys.dim() == 1, "keys must be 1-D, got shape ", keys.sizes());
  TORCH_CHECK_VALUE(keys.device() == table_keys.device(), "keys are on ", keys.device(), " but the table on ",
                    table_keys.device());
  if (values != nullptr) {
    TORCH_CHECK_TYPE(values->scalar_type() == table_values.scalar_type(),
                     "values must have the table's value dtype ", table_values.scalar_type(), ", got ",
                     values->scalar_type());
    TORCH_CHECK_VALUE(values->dim() == 1 && values->size(0) == keys.size(0), "values must be 1-D with ",
                      keys.size(0), " entries like keys, got shape ", values->sizes());
    TORCH_CHECK_VALUE(values->device() == table_keys.device(), "values are on ", values->device(),
                      " but the table on ", table_keys.device());
  }
  if (keys.numel() > 0) {
    const bool is_int32 = keys.scalar_type() == at::kInt;
    const int64_t marker = is_int32 ? std::numeric_limits<int32_t>::max() : std::numeric_limits<int64_t>::max();
    TORCH_CHECK_VALUE(!to_host(keys.eq(marker).any()).item<bool>(), "keys must not contain ", marker,
                      " (the largest ", keys.scalar_type(), ", reserved to mark empty slots)");
  }
}

}  // namespace ops
}  // namespace spconv
