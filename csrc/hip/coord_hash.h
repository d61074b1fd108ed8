// The device side of the kernel maps' coordinate hash table: open addressing over packed int64 keys
// (spconv/coords.h: pack_key, hash_key), linear probing, empty slot = -1, int32 values beside the keys.
#pragma once
#include "hip_compat.h"

#include "spconv/coords.h"

namespace spconv {
namespace gpu {

__device__ __forceinline__ int64_t hash_slot_of(int64_t key, int64_t cap) {
  return static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(cap - 1));
}

// Returns the slot holding key (inserting it when absent) and whether this call inserted it; -1 when the
// table is full (at most cap probes: the callers size tables at >= 2x their keys, so it only guards a bug).
__device__ __forceinline__ int64_t hash_insert(int64_t* hkeys, int64_t cap, int64_t key, bool* inserted) {
  typedef unsigned long long ull;
  int64_t slot = hash_slot_of(key, cap);
  *inserted = false;
  for (int64_t probe = 0; probe < cap; ++probe) {
    ull prev = atomicCAS(reinterpret_cast<ull*>(hkeys + slot), static_cast<ull>(-1LL), static_cast<ull>(key));
    if (prev == static_cast<ull>(-1LL)) {
      *inserted = true;
      return slot;
    }
    if (prev == static_cast<ull>(key)) return slot;
    slot = (slot + 1) & (cap - 1);
  }
  return -1;
}

// The slot of key, or -1 when absent (after at most cap probes: a full table holds no empty slot to stop at).
__device__ __forceinline__ int64_t hash_find(const int64_t* hkeys, int64_t cap, int64_t key) {
  int64_t slot = hash_slot_of(key, cap);
  for (int64_t probe = 0; probe < cap; ++probe) {
    int64_t k = hkeys[slot];
    if (k == key) return slot;
    if (k == -1) return -1;
    slot = (slot + 1) & (cap - 1);
  }
  return -1;
}

}  // namespace gpu
}  // namespace spconv
