// Kernel maps on the GPU: a hash table of packed int64 coordinate keys (linear probing, atomicCAS insert)
// and the kernels that build submanifold, regular and transposed maps from it. Compaction of the tables
// into pairs grouped by offset is done by the glue with ATen (nonzero / sort), which keeps the pair order
// of the CPU route: offsets ascending, rows ascending within an offset.
#include "hip_compat.h"

#include <climits>

#include "launchers.h"
#include "spconv/coords.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
typedef unsigned long long ull;

__device__ __forceinline__ int64_t slot_of(int64_t key, int64_t cap) {
  return static_cast<int64_t>(hash_key(key) & static_cast<uint64_t>(cap - 1));
}

// Returns the slot holding key (inserting it when absent) and whether this call inserted it; -1 when the
// table is full (at most cap probes: the callers size tables at >= 2x their keys, so it only guards a bug).
__device__ __forceinline__ int64_t hash_insert(int64_t* hkeys, int64_t cap, int64_t key, bool* inserted) {
  int64_t slot = slot_of(key, cap);
  *inserted = false;
  for (int64_t probe = 0; probe < cap; ++probe) {
    ull prev = atomicCAS(reinterpret_cast<ull*>(hkeys + slot), static_cast<ull>(-1LL), static_cast<ull>(key));
    if (prev == static_cast<ull>(-1LL)) {
      *inserted = true;
      return slot;
    }
    if (prev == static_cast<ull>(key)) {
      *inserted = false;
      return slot;
    }
    slot = (slot + 1) & (cap - 1);
  }
  return -1;
}

// The slot of key, or -1 when absent (after at most cap probes: a full table holds no empty slot to stop at).
__device__ __forceinline__ int64_t hash_find(const int64_t* hkeys, int64_t cap, int64_t key) {
  int64_t slot = slot_of(key, cap);
  for (int64_t probe = 0; probe < cap; ++probe) {
    int64_t k = hkeys[slot];
    if (k == key) return slot;
    if (k == -1) return -1;
    slot = (slot + 1) & (cap - 1);
  }
  return -1;
}

__global__ void clear_kernel(int64_t* keys, int32_t* values, int64_t cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < cap; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = -1;
    if (values) values[i] = -1;
  }
}

__global__ void subm_insert_kernel(const int32_t* indices, int64_t n, ConvGeometry g, int64_t* hkeys,
                                   int32_t* hvals, int64_t cap, int32_t* dup_row, int32_t* full) {
  const int w = g.ndim + 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t* row = indices + i * w;
    bool inserted;
    int64_t slot = hash_insert(hkeys, cap, pack_key(row[0], row + 1, g.in_shape, g.ndim), &inserted);
    if (slot < 0)
      atomicExch(full, 1);
    else if (inserted)
      hvals[slot] = static_cast<int32_t>(i);
    else
      atomicMin(dup_row, static_cast<int32_t>(i));
  }
}

__global__ void subm_neighbors_kernel(const int32_t* indices, int64_t n, ConvGeometry g, const int64_t* hkeys,
                                      const int32_t* hvals, int64_t cap, int32_t* nbr) {
  const int w = g.ndim + 1;
  const int64_t total = n * g.kvol;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / g.kvol, k = t - i * g.kvol;
    const int32_t* row = indices + i * w;
    int32_t koff[kMaxDim], nb[kMaxDim];
    unravel_offset(k, g.ksize, g.ndim, koff);
    int32_t v = -1;
    if (subm_neighbor(g, row + 1, koff, nb)) {
      int64_t slot = hash_find(hkeys, cap, pack_key(row[0], nb, g.in_shape, g.ndim));
      if (slot >= 0) v = hvals[slot];
    }
    nbr[t] = v;
  }
}

__global__ void candidate_keys_kernel(const int32_t* indices, int64_t n, ConvGeometry g, bool transpose,
                                      int64_t* keys) {
  const int w = g.ndim + 1;
  const int64_t total = n * g.kvol;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / g.kvol, k = t - i * g.kvol;
    const int32_t* row = indices + i * w;
    int32_t koff[kMaxDim], o[kMaxDim];
    unravel_offset(k, g.ksize, g.ndim, koff);
    bool ok = transpose ? deconv_output(g, row + 1, koff, o) : conv_output(g, row + 1, koff, o);
    keys[t] = ok ? pack_key(row[0], o, g.out_shape, g.ndim) : -1;
  }
}

__global__ void insert_keys_kernel(const int64_t* keys, int64_t count, int64_t* hkeys, int64_t cap, int32_t* full) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t key = keys[t];
    if (key < 0) continue;
    bool inserted;
    if (hash_insert(hkeys, cap, key, &inserted) < 0) atomicExch(full, 1);
  }
}

__global__ void assign_rank_kernel(const int64_t* uniq, int64_t m, const int64_t* hkeys, int32_t* hvals,
                                   int64_t cap) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < m; r += int64_t(gridDim.x) * blockDim.x) {
    int64_t slot = hash_find(hkeys, cap, uniq[r]);
    if (slot >= 0) hvals[slot] = static_cast<int32_t>(r);
  }
}

__global__ void lookup_kernel(const int64_t* keys, int64_t count, const int64_t* hkeys, const int32_t* hvals,
                              int64_t cap, int32_t* out) {
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < count; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t key = keys[t];
    int32_t v = -1;
    if (key >= 0) {
      int64_t slot = hash_find(hkeys, cap, key);
      if (slot >= 0) v = hvals[slot];
    }
    out[t] = v;
  }
}

__global__ void decode_kernel(const int64_t* keys, int64_t m, ConvGeometry g, bool use_out_shape, int32_t* out) {
  const int w = g.ndim + 1;
  const int32_t* shape = use_out_shape ? g.out_shape : g.in_shape;
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < m; r += int64_t(gridDim.x) * blockDim.x) {
    int64_t key = keys[r];
    for (int d = g.ndim - 1; d >= 0; --d) {
      out[r * w + 1 + d] = static_cast<int32_t>(key % shape[d]);
      key /= shape[d];
    }
    out[r * w] = static_cast<int32_t>(key);
  }
}

}  // namespace

const char* error_string(int code) { return hipGetErrorString(static_cast<hipError_t>(code)); }

int64_t hash_capacity(int64_t expected) {
  int64_t cap = 16;
  while (cap < 2 * expected) cap <<= 1;
  return cap;
}

int hash_clear(int64_t* keys, int32_t* values, int64_t cap, void* stream) {
  if (cap <= 0) return 0;
  launch_kernel(clear_kernel, grid_1d(cap, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), keys, values,
      cap);
  return last_launch_error();
}

int subm_insert(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t* hkeys, int32_t* hvals,
                int64_t cap, int32_t* dup_row, int32_t* full, void* stream) {
  if (n <= 0) return 0;
  launch_kernel(subm_insert_kernel, grid_1d(n, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), indices, n,
      g, hkeys, hvals, cap, dup_row, full);
  return last_launch_error();
}

int subm_neighbors(const int32_t* indices, int64_t n, const ConvGeometry& g, const int64_t* hkeys,
                   const int32_t* hvals, int64_t cap, int32_t* nbr, void* stream) {
  if (n <= 0 || g.kvol <= 0) return 0;
  launch_kernel(subm_neighbors_kernel, grid_1d(n * g.kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      indices, n, g, hkeys, hvals, cap, nbr);
  return last_launch_error();
}

int conv_candidate_keys(const int32_t* indices, int64_t n, const ConvGeometry& g, bool transpose, int64_t* keys,
                        void* stream) {
  if (n <= 0 || g.kvol <= 0) return 0;
  launch_kernel(candidate_keys_kernel, grid_1d(n * g.kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      indices, n, g, transpose, keys);
  return last_launch_error();
}

int hash_insert_keys(const int64_t* keys, int64_t count, int64_t* hkeys, int64_t cap, int32_t* full, void* stream) {
  if (count <= 0) return 0;
  launch_kernel(insert_keys_kernel, grid_1d(count, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), keys,
      count, hkeys, cap, full);
  return last_launch_error();
}

int hash_assign_rank(const int64_t* uniq, int64_t m, const int64_t* hkeys, int32_t* hvals, int64_t cap,
                     void* stream) {
  if (m <= 0) return 0;
  launch_kernel(assign_rank_kernel, grid_1d(m, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), uniq, m,
      hkeys, hvals, cap);
  return last_launch_error();
}

int hash_lookup(const int64_t* keys, int64_t count, const int64_t* hkeys, const int32_t* hvals, int64_t cap,
                int32_t* out, void* stream) {
  if (count <= 0) return 0;
  launch_kernel(lookup_kernel, grid_1d(count, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), keys, count,
      hkeys, hvals, cap, out);
  return last_launch_error();
}

int decode_keys(const int64_t* keys, int64_t m, const ConvGeometry& g, bool use_out_shape, int32_t* out_indices,
                void* stream) {
  if (m <= 0) return 0;
  launch_kernel(decode_kernel, grid_1d(m, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), keys, m, g,
      use_out_shape, out_indices);
  return last_launch_error();
}

}  // namespace gpu
}  // namespace spconv
