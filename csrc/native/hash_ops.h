// Key -> value hash table behind spconv.pytorch.hash.HashTable on the CPU: open addressing with linear
// probing over `cap` slots held in two flat arrays (so Python owns the storage as tensors). A slot is
// empty when its key equals empty_key<K>() (the largest K, which callers reject as a key). Values are
// copied as raw bits, so V is uint32_t or uint64_t whatever the value dtype. The GPU table
// (csrc/hip/hash_table_ops.cu) uses the same layout and probe sequence.
#pragma once
#include <cstdint>
#include <limits>

#include "spconv/coords.h"

namespace spconv {
namespace native {

template <typename K>
constexpr K empty_key() {
  return std::numeric_limits<K>::max();
}

template <typename K>
inline int64_t probe_start(K key, int64_t cap) {
  return static_cast<int64_t>(hash_key(static_cast<int64_t>(key)) % static_cast<uint64_t>(cap));
}

// Inserts keys in order. A key already in the table keeps its value; a key given several times gets the
// value of its first occurrence. values == nullptr stores 0. Returns -1, or the index of the first key
// that found the table full (the table then holds the keys before it).
template <typename K, typename V>
int64_t kv_insert(K* table_keys, V* table_values, int64_t cap, const K* keys, const V* values, int64_t n);

// out[i] = value of keys[i] and is_empty[i] = 0, or out[i] = 0 and is_empty[i] = 1 when absent.
// Parallel over keys.
template <typename K, typename V>
void kv_query(const K* table_keys, const V* table_values, int64_t cap, const K* keys, int64_t n, V* out,
              uint8_t* is_empty);

// Overwrites the value of every key already present (the first occurrence wins for repeated keys);
// is_empty[i] = 1 for keys not in the table, which are not inserted.
template <typename K, typename V>
void kv_insert_exist(const K* table_keys, V* table_values, int64_t cap, const K* keys, const V* values, int64_t n,
                     uint8_t* is_empty);

}  // namespace native
}  // namespace spconv
