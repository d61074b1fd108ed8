// CPU implementation of the hash_table_* ops behind spconv.pytorch.hash.HashTable (csrc/native/hash_ops).
#include <ATen/ATen.h>
#include <torch/library.h>

#include "../hash_checks.h"
#include "../../native/hash_ops.h"

namespace spconv {
namespace ops {
namespace {

// Calls f with K = the key type and V = unsigned raw-bit type of the value's width.
template <typename F>
void dispatch_kv(const at::Tensor& table_keys, const at::Tensor& table_values, F&& f) {
  const bool k64 = table_keys.scalar_type() == at::kLong;
  const bool v64 = table_values.element_size() == 8;
  if (k64 && v64) f(int64_t{}, uint64_t{});
  else if (k64) f(int64_t{}, uint32_t{});
  else if (v64) f(int32_t{}, uint64_t{});
  else f(int32_t{}, uint32_t{});
}

void hash_table_insert_cpu(const at::Tensor& table_keys, const at::Tensor& table_values, const at::Tensor& keys_arg,
                           const std::optional<at::Tensor>& values_arg) {
  const auto [keys, values] = hash_input(table_keys, table_values, keys_arg, values_arg ? &*values_arg : nullptr);
  const int64_t cap = table_keys.size(0);
  int64_t failed = -1;
  dispatch_kv(table_keys, table_values, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    failed = native::kv_insert<K, V>(
        static_cast<K*>(table_keys.data_ptr()), static_cast<V*>(table_values.data_ptr()), cap,
        static_cast<const K*>(keys.const_data_ptr()),
        values.defined() ? static_cast<const V*>(values.const_data_ptr()) : nullptr, keys.size(0));
  });
  TORCH_CHECK_VALUE(failed < 0, "hash table is full (", cap, " slots): keys[", failed,
                    "] and later keys were not inserted; use a larger max_size");
}

std::tuple<at::Tensor, at::Tensor> hash_table_query_cpu(const at::Tensor& table_keys, const at::Tensor& table_values,
                                                        const at::Tensor& keys_arg) {
  const at::Tensor keys = hash_input(table_keys, table_values, keys_arg, nullptr).keys;
  at::Tensor out = at::empty({keys.size(0)}, table_values.options());
  at::Tensor is_empty = key_flags(keys);
  dispatch_kv(table_keys, table_values, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    native::kv_query<K, V>(static_cast<const K*>(table_keys.const_data_ptr()),
                           static_cast<const V*>(table_values.const_data_ptr()), table_keys.size(0),
                           static_cast<const K*>(keys.const_data_ptr()), keys.size(0),
                           static_cast<V*>(out.data_ptr()), is_empty.mutable_data_ptr<uint8_t>());
  });
  return {out, is_empty};
}

at::Tensor hash_table_insert_exist_keys_cpu(const at::Tensor& table_keys, const at::Tensor& table_values,
                                            const at::Tensor& keys_arg, const at::Tensor& values_arg) {
  const auto [keys, values] = hash_input(table_keys, table_values, keys_arg, &values_arg);
  at::Tensor is_empty = key_flags(keys);
  dispatch_kv(table_keys, table_values, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    native::kv_insert_exist<K, V>(static_cast<const K*>(table_keys.const_data_ptr()),
                                  static_cast<V*>(table_values.data_ptr()), table_keys.size(0),
                                  static_cast<const K*>(keys.const_data_ptr()),
                                  static_cast<const V*>(values.const_data_ptr()), keys.size(0),
                                  is_empty.mutable_data_ptr<uint8_t>());
  });
  return is_empty;
}

}  // namespace

TORCH_LIBRARY_IMPL(spconv, CPU, m) {
  m.impl("hash_table_insert", &hash_table_insert_cpu);
  m.impl("hash_table_query", &hash_table_query_cpu);
  m.impl("hash_table_insert_exist_keys", &hash_table_insert_exist_keys_cpu);
}

}  // namespace ops
}  // namespace spconv
