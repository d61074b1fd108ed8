// Sorting of (int64 key, int32 index) pairs for kernel-map building.
#pragma once
#include <cstdint>
#include <vector>

#include "uninit_vector.h"

namespace spconv {
namespace native {

// Sorts the indices 0..m-1 by (keys[i], i): on return sorted_keys[s] and index[s] are the key and the
// index at sorted position s. keys must be >= 0. sorted_keys gets one extra trailing entry, INT64_MAX,
// larger than any key: a sentinel that ends forward scans without a bounds check.
void sort_key_index(const int64_t* keys, int64_t m, UninitVector<int64_t>& sorted_keys, UninitVector<int32_t>& index);

// Stable LSD radix sort of words on bits [lo, hi); the other bits ride along.
void radix_sort_bits(UninitVector<uint64_t>& words, int lo, int hi);

}  // namespace native
}  // namespace spconv
