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

// What every hash_table_* op of the CPU and GPU glue starts from: the keys (and values, undefined when
// absent) checked against the table and made contiguous.
struct HashInput {
  at::Tensor keys, values;
};
HashInput hash_input(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys,
                     const at::Tensor* values);

// One uint8 flag per key (the is_empty result of query / insert_exist_keys).
inline at::Tensor key_flags(const at::Tensor& keys) { return at::empty({keys.size(0)}, keys.options().dtype(at::kByte)); }

}  // namespace ops
}  // namespace spconv
