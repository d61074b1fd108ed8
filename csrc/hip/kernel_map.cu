// Kernel maps on the GPU: a hash table of packed int64 coordinate keys (coord_hash.h: linear probing, atomicCAS
// insert) and the kernels that build regular and transposed maps from it (submanifold maps: subm_map.cu).
// Compaction of the tables into pairs grouped by offset is done by the glue with ATen (nonzero / sort), which keeps the pair order
// of the CPU route: offsets ascending, rows ascending within an offset.
#include "hip_compat.h"

#include <climits>

#include "coord_hash.h"
#include "launchers.h"
#include "spconv/coords.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
typedef unsigned long long ull;

__global__ void clear_kernel(int64_t* keys, int32_t* values, int64_t cap) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < cap; i += int64_t(gridDim.x) * blockDim.x) {
    keys[i] = -1;
    if (values) values[i] = -1;
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
