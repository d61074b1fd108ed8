#include "hash_ops.h"

#include <ATen/Parallel.h>

#include <vector>

namespace spconv {
namespace native {
namespace {

// Slot holding key, or -1 when absent. Stops at an empty slot or after visiting every slot.
template <typename K>
int64_t find_slot(const K* table_keys, int64_t cap, K key) {
  int64_t s = probe_start(key, cap);
  for (int64_t step = 0; step < cap; ++step) {
    const K k = table_keys[s];
    if (k == key) return s;
    if (k == empty_key<K>()) return -1;
    s = s + 1 == cap ? 0 : s + 1;
  }
  return -1;
}

}  // namespace

template <typename K, typename V>
int64_t kv_insert(K* table_keys, V* table_values, int64_t cap, const K* keys, const V* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const K key = keys[i];
    int64_t s = probe_start(key, cap);
    bool placed = false;
    for (int64_t step = 0; step < cap; ++step) {
      const K k = table_keys[s];
      if (k == key) {  // present: keeps its value
        placed = true;
        break;
      }
      if (k == empty_key<K>()) {
        table_keys[s] = key;
        table_values[s] = values ? values[i] : V(0);
        placed = true;
        break;
      }
      s = s + 1 == cap ? 0 : s + 1;
    }
    if (!placed) return i;
  }
  return -1;
}

template <typename K, typename V>
void kv_query(const K* table_keys, const V* table_values, int64_t cap, const K* keys, int64_t n, V* out,
              uint8_t* is_empty) {
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int64_t s = find_slot(table_keys, cap, keys[i]);
      out[i] = s >= 0 ? table_values[s] : V(0);
      is_empty[i] = s < 0;
    }
  });
}

template <typename K, typename V>
void kv_insert_exist(const K* table_keys, V* table_values, int64_t cap, const K* keys, const V* values, int64_t n,
                     uint8_t* is_empty) {
  std::vector<int64_t> slots(static_cast<size_t>(n));
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      slots[i] = find_slot(table_keys, cap, keys[i]);
      is_empty[i] = slots[i] < 0;
    }
  });
  // Backwards, so that the first occurrence of a repeated key writes last.
  for (int64_t i = n - 1; i >= 0; --i)
    if (slots[i] >= 0) table_values[slots[i]] = values[i];
}

#define SPCONV_INSTANTIATE_KV(K, V)                                                                        \
  template int64_t kv_insert<K, V>(K*, V*, int64_t, const K*, const V*, int64_t);                          \
  template void kv_query<K, V>(const K*, const V*, int64_t, const K*, int64_t, V*, uint8_t*);              \
  template void kv_insert_exist<K, V>(const K*, V*, int64_t, const K*, const V*, int64_t, uint8_t*);

SPCONV_INSTANTIATE_KV(int32_t, uint32_t)
SPCONV_INSTANTIATE_KV(int32_t, uint64_t)
SPCONV_INSTANTIATE_KV(int64_t, uint32_t)
SPCONV_INSTANTIATE_KV(int64_t, uint64_t)
#undef SPCONV_INSTANTIATE_KV

}  // namespace native
}  // namespace spconv
