// Argument checks of the hash_table_* ops, shared by the CPU and GPU glue. Messages name the argument.
#pragma once
#include <ATen/ATen.h>

namespace spconv {
namespace ops {

// table_keys [cap] int32/int64 and table_values [cap] int32/int64/float32/float64, contiguous, same device.
void check_hash_table(const at::Tensor& table_keys, const at::Tensor& table_values);

// keys [n] of the table's key dtype on its device, none equal to the empty-slot marker (the key dtype's
// maximum); values (when defined) [n] of the table's value dtype.
void check_hash_keys(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys,
                     const at::Tensor* values);

}  // namespace ops
}  // namespace spconv
