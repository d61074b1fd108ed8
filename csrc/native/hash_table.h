// Open-addressing hash table (linear probing) from packed int64 coordinate keys to int32 row ids.
// Built single-threaded in row order (so ids are deterministic), queried from many threads.
#pragma once
#include <cstdint>
#include <vector>

#include "spconv/coords.h"

namespace spconv {
namespace native {

// Used by point-to-voxel (kernel maps merge sorted keys instead). Slots are chosen per block of 16
// consecutive keys (same batch/z/y, neighbouring x), so nearby points touch few cache lines; blocks are
// spread by Fibonacci hashing (one multiply). A one-bit-per-key filter, 8x the table size in bits and
// cache-resident, answers most misses without probing the table.
class CoordHashTable {
 public:
  explicit CoordHashTable(int64_t expected) {
    int64_t cap = 64;
    int bits = 6;
    while (cap < 2 * expected) {
      cap <<= 1;
      ++bits;
    }
    mask_ = static_cast<uint64_t>(cap - 1);
    block_shift_ = 64 - (bits - kBlockBits);
    filter_shift_ = 64 - (bits + 3);
    slots_.assign(static_cast<size_t>(cap), Slot{-1, -1});
    filter_.assign(static_cast<size_t>(cap / 8), 0);
  }

  // Inserts key -> value unless present; returns the value stored for key.
  int32_t insert(int64_t key, int32_t value) {
    for (uint64_t s = slot_of(key);; s = (s + 1) & mask_) {
      Slot& slot = slots_[s];
      if (slot.key == key) return slot.value;
      if (slot.key == -1) {
        slot = Slot{key, value};
        const uint64_t bit = filter_bit(key);
        filter_[bit >> 6] |= uint64_t{1} << (bit & 63);
        return value;
      }
    }
  }

  int32_t find(int64_t key) const {
    const uint64_t bit = filter_bit(key);
    if (!((filter_[bit >> 6] >> (bit & 63)) & 1)) return -1;
    for (uint64_t s = slot_of(key);; s = (s + 1) & mask_) {
      const Slot& slot = slots_[s];
      if (slot.key == key) return slot.value;
      if (slot.key == -1) return -1;
    }
  }

 private:
  static constexpr int kBlockBits = 4;
  struct Slot {
    int64_t key;
    int64_t value;  // int32 id, padded so a slot is 16 bytes
  };

  static constexpr uint64_t kGolden = 0x9E3779B97F4A7C15ULL;

  uint64_t slot_of(int64_t key) const {
    const uint64_t low = static_cast<uint64_t>(key) & ((1u << kBlockBits) - 1);
    const uint64_t block = (static_cast<uint64_t>(key >> kBlockBits) * kGolden) >> block_shift_;
    return (block << kBlockBits) | low;
  }

  uint64_t filter_bit(int64_t key) const { return ((static_cast<uint64_t>(key) + 1) * kGolden) >> filter_shift_; }

  uint64_t mask_;
  int block_shift_;
  int filter_shift_;
  std::vector<Slot> slots_;
  std::vector<uint64_t> filter_;
};

}  // namespace native
}  // namespace spconv
