// GPU implementation of the hash_table_* ops behind spconv.pytorch.hash.HashTable (csrc/hip/hash_table_ops.cu).
// The Python wrapper keeps the fixed-size table from filling up; the kernels also stop after `cap` probes.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "../hash_checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

int key_bytes(const at::Tensor& t) { return static_cast<int>(t.element_size()); }

void hash_table_insert_gpu(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys_arg,
                           const std::optional<at::Tensor>& values_arg) {
  c10::DeviceGuard guard(table_keys.device());
  const auto [keys, values] = hash_input(table_keys, table_values, keys_arg, values_arg ? &*values_arg : nullptr);
  const int64_t cap = table_keys.size(0), n = keys.size(0);
  if (n == 0) return;
  at::Tensor first = at::full({cap}, std::numeric_limits<int32_t>::max(), keys.options().dtype(at::kInt));
  at::Tensor claimed = at::zeros({cap}, keys.options().dtype(at::kByte));
  check_launch(gpu::hash_kv_insert(key_bytes(table_keys), key_bytes(table_values), table_keys.data_ptr(),
                                   table_values.data_ptr(), cap, keys.const_data_ptr(),
                                   values.defined() ? values.const_data_ptr() : nullptr, n,
                                   first.mutable_data_ptr<int32_t>(), claimed.mutable_data_ptr<uint8_t>(),
                                   current_stream(table_keys.device())),
               "hash_kv_insert");
}

std::tuple<at::Tensor, at::Tensor> hash_table_query_gpu(const at::Tensor& table_keys, const at::Tensor& table_values,
                                                        const at::Tensor& keys_arg) {
  c10::DeviceGuard guard(table_keys.device());
  const at::Tensor keys = hash_input(table_keys, table_values, keys_arg, nullptr).keys;
  at::Tensor out = at::empty({keys.size(0)}, table_values.options());
  at::Tensor is_empty = key_flags(keys);
  check_launch(gpu::hash_kv_query(key_bytes(table_keys), key_bytes(table_values), table_keys.const_data_ptr(),
                                  table_values.const_data_ptr(), table_keys.size(0), keys.const_data_ptr(),
                                  keys.size(0), out.mutable_data_ptr(), is_empty.mutable_data_ptr<uint8_t>(),
                                  current_stream(table_keys.device())),
               "hash_kv_query");
  return {out, is_empty};
}

at::Tensor hash_table_insert_exist_keys_gpu(const at::Tensor& table_keys, const at::Tensor& table_values,
                                            const at::Tensor& keys_arg, const at::Tensor& values_arg) {
  c10::DeviceGuard guard(table_keys.device());
  const auto [keys, values] = hash_input(table_keys, table_values, keys_arg, &values_arg);
  const int64_t cap = table_keys.size(0);
  at::Tensor is_empty = key_flags(keys);
  at::Tensor first = at::full({cap}, std::numeric_limits<int32_t>::max(), keys.options().dtype(at::kInt));
  check_launch(gpu::hash_kv_insert_exist(key_bytes(table_keys), key_bytes(table_values), table_keys.const_data_ptr(),
                                         table_values.data_ptr(), cap, keys.const_data_ptr(), values.const_data_ptr(),
                                         keys.size(0), first.mutable_data_ptr<int32_t>(),
                                         is_empty.mutable_data_ptr<uint8_t>(), current_stream(table_keys.device())),
               "hash_kv_insert_exist");
  return is_empty;
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("hash_table_insert", &hash_table_insert_gpu);
  m.impl("hash_table_query", &hash_table_query_gpu);
  m.impl("hash_table_insert_exist_keys", &hash_table_insert_exist_keys_gpu);
}

}  // namespace ops
}  // namespace spconv
