// GPU side of spconv.pytorch.hash.HashTable: the same table layout and probe sequence as the CPU route
// (csrc/native/hash_ops.h), fixed capacity, deterministic results whatever the thread schedule:
// for keys repeated within one call the first occurrence wins, found with an atomicMin on a per-slot
// scratch array in a first pass and applied in a second.
#include <climits>

#include "hip_compat.h"
#include "launchers.h"
#include "spconv/coords.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;

template <typename K> __device__ __forceinline__ K empty_key();
template <> __device__ __forceinline__ int32_t empty_key<int32_t>() { return INT_MAX; }
template <> __device__ __forceinline__ int64_t empty_key<int64_t>() { return LLONG_MAX; }

__device__ __forceinline__ int32_t cas_key(int32_t* addr, int32_t expected, int32_t desired) {
  return atomicCAS(reinterpret_cast<int*>(addr), expected, desired);
}
__device__ __forceinline__ int64_t cas_key(int64_t* addr, int64_t expected, int64_t desired) {
  return static_cast<int64_t>(atomicCAS(reinterpret_cast<unsigned long long*>(addr),
                                        static_cast<unsigned long long>(expected),
                                        static_cast<unsigned long long>(desired)));
}

template <typename K>
__device__ __forceinline__ int64_t probe_start(K key, int64_t cap) {
  return static_cast<int64_t>(hash_key(static_cast<int64_t>(key)) % static_cast<uint64_t>(cap));
}

template <typename K>
__device__ int64_t find_slot(const K* tkeys, int64_t cap, K key) {
  int64_t s = probe_start(key, cap);
  for (int64_t step = 0; step < cap; ++step) {
    const K k = tkeys[s];
    if (k == key) return s;
    if (k == empty_key<K>()) return -1;
    s = s + 1 == cap ? 0 : s + 1;
  }
  return -1;
}

// Pass 1 of insert: claims or finds the slot of every key; claimed[s] = 1 for slots new in this call;
// first[s] = smallest i whose key sits in s.
template <typename K>
__global__ void insert_claim_kernel(K* tkeys, int64_t cap, const K* keys, int64_t n, int32_t* first,
                                    uint8_t* claimed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const K key = keys[i];
    int64_t s = probe_start(key, cap);
    for (int64_t step = 0; step < cap; ++step) {
      const K prev = cas_key(tkeys + s, empty_key<K>(), key);
      if (prev == empty_key<K>()) claimed[s] = 1;
      if (prev == empty_key<K>() || prev == key) {
        atomicMin(first + s, static_cast<int32_t>(i));
        break;
      }
      s = s + 1 == cap ? 0 : s + 1;
    }
  }
}

// Pass 2 of insert (claimed != nullptr) and of insert_exist_keys (claimed == nullptr): the first
// occurrence of each key writes its value (0 when values is null).
template <typename K, typename V>
__global__ void write_first_kernel(const K* tkeys, V* tvals, int64_t cap, const K* keys, const V* values, int64_t n,
                                   const int32_t* first, const uint8_t* claimed) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t s = find_slot(tkeys, cap, keys[i]);
    if (s < 0 || first[s] != static_cast<int32_t>(i)) continue;
    if (claimed != nullptr && !claimed[s]) continue;  // present before this call: keeps its value
    tvals[s] = values != nullptr ? values[i] : V(0);
  }
}

// Pass 1 of insert_exist_keys.
template <typename K>
__global__ void exist_mark_kernel(const K* tkeys, int64_t cap, const K* keys, int64_t n, int32_t* first,
                                  uint8_t* is_empty) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t s = find_slot(tkeys, cap, keys[i]);
    is_empty[i] = s < 0;
    if (s >= 0) atomicMin(first + s, static_cast<int32_t>(i));
  }
}

template <typename K, typename V>
__global__ void query_kernel(const K* tkeys, const V* tvals, int64_t cap, const K* keys, int64_t n, V* out,
                             uint8_t* is_empty) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t s = find_slot(tkeys, cap, keys[i]);
    out[i] = s >= 0 ? tvals[s] : V(0);
    is_empty[i] = s < 0;
  }
}

// Calls f(K{}, V{}) for the key width and the raw-bit value width.
template <typename F>
int dispatch_kv(int key_bytes, int value_bytes, F&& f) {
  if ((key_bytes != 4 && key_bytes != 8) || (value_bytes != 4 && value_bytes != 8))
    return static_cast<int>(hipErrorInvalidValue);
  if (key_bytes == 8 && value_bytes == 8) f(int64_t{}, uint64_t{});
  else if (key_bytes == 8) f(int64_t{}, uint32_t{});
  else if (value_bytes == 8) f(int32_t{}, uint64_t{});
  else f(int32_t{}, uint32_t{});
  return last_launch_error();
}

}  // namespace

int hash_kv_insert(int key_bytes, int value_bytes, void* table_keys, void* table_values, int64_t cap,
                   const void* keys, const void* values, int64_t n, int32_t* first, uint8_t* claimed, void* stream) {
  if (n == 0) return 0;
  if (cap < 1) return static_cast<int>(hipErrorInvalidValue);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  return dispatch_kv(key_bytes, value_bytes, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    launch_kernel(insert_claim_kernel<K>, blocks, kThreads, 0, s, static_cast<K*>(table_keys), cap,
        static_cast<const K*>(keys), n, first, claimed);
    launch_kernel(write_first_kernel<K, V>, blocks, kThreads, 0, s, static_cast<const K*>(table_keys),
        static_cast<V*>(table_values), cap, static_cast<const K*>(keys), static_cast<const V*>(values), n, first,
        claimed);
  });
}

int hash_kv_query(int key_bytes, int value_bytes, const void* table_keys, const void* table_values, int64_t cap,
                  const void* keys, int64_t n, void* out, uint8_t* is_empty, void* stream) {
  if (n == 0) return 0;
  if (cap < 1) return static_cast<int>(hipErrorInvalidValue);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  return dispatch_kv(key_bytes, value_bytes, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    launch_kernel(query_kernel<K, V>, blocks, kThreads, 0, s, static_cast<const K*>(table_keys),
        static_cast<const V*>(table_values), cap, static_cast<const K*>(keys), n, static_cast<V*>(out), is_empty);
  });
}

int hash_kv_insert_exist(int key_bytes, int value_bytes, const void* table_keys, void* table_values, int64_t cap,
                         const void* keys, const void* values, int64_t n, int32_t* first, uint8_t* is_empty,
                         void* stream) {
  if (n == 0) return 0;
  if (cap < 1) return static_cast<int>(hipErrorInvalidValue);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  return dispatch_kv(key_bytes, value_bytes, [&](auto k, auto v) {
    using K = decltype(k);
    using V = decltype(v);
    launch_kernel(exist_mark_kernel<K>, blocks, kThreads, 0, s, static_cast<const K*>(table_keys), cap,
        static_cast<const K*>(keys), n, first, is_empty);
    launch_kernel(write_first_kernel<K, V>, blocks, kThreads, 0, s, static_cast<const K*>(table_keys),
        static_cast<V*>(table_values), cap, static_cast<const K*>(keys), static_cast<const V*>(values), n, first,
        nullptr);
  });
}

}  // namespace gpu
}  // namespace spconv
