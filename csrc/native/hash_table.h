// Open-addressing hash table (linear probing) from packed int64 coordinate keys to int32 row ids.
// Built single-threaded in row order (so ids are deterministic), queried from many threads.
#pragma once
#include <cstdint>
#include <vector>

#include "spconv/coords.h"

namespace spconv {
namespace native {

class CoordHashTable {
 public:
  explicit CoordHashTable(int64_t expected) {
    int64_t cap = 16;
    while (cap < 2 * expected) cap <<= 1;
    mask_ = static_cast<uint64_t>(cap - 1);
    keys_.assign(static_cast<size_t>(cap), -1);
    values_.assign(static_cast<size_t>(cap), -1);
  }

  // Inserts key -> value unless present; returns the value stored for key.
  int32_t insert(int64_t key, int32_t value) {
    uint64_t slot = hash_key(key) & mask_;
    while (true) {
      int64_t k = keys_[slot];
      if (k == key) return values_[slot];
      if (k == -1) {
        keys_[slot] = key;
        values_[slot] = value;
        return value;
      }
      slot = (slot + 1) & mask_;
    }
  }

  int32_t find(int64_t key) const {
    uint64_t slot = hash_key(key) & mask_;
    while (true) {
      int64_t k = keys_[slot];
      if (k == key) return values_[slot];
      if (k == -1) return -1;
      slot = (slot + 1) & mask_;
    }
  }

 private:
  uint64_t mask_;
  std::vector<int64_t> keys_;
  std::vector<int32_t> values_;
};

}  // namespace native
}  // namespace spconv
