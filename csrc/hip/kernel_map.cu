// Regular, transposed and pooling kernel maps on the GPU in four kernels (submanifold maps: subm_map.cu), with
// the glue's stable sort of the input keys and one scan between them. The results are the CPU route's
// (csrc/native/indice_pairs.cpp) bit for bit: it visits the inputs in (coordinate key, row) order, each input's
// offsets ascending, and numbers the outputs in the order it first reaches them. Here visit v = r * kvol + k
// (input rank r, offset k) inserts its output key into the coordinate hash table (coord_hash.h) and keeps the
// smallest visit per slot (atomic min); an output's id is then the number of first visits before its own, and a
// pair's position the number of hits before it in (offset, input row) order: one prefix sum over both flag
// arrays gives both. Every result is an integer written once, a sum or a minimum: deterministic whatever the
// thread schedule (the optional out->in table is written only for maps without duplicate coordinates, where
// each of its entries has one input). No warp-level code.
#include "hip_compat.h"

#include <climits>

#include "coord_hash.h"
#include "launchers.h"
#include "spconv/coords.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Per-block pair counts of the first offsets, in shared memory (the rest are added to the global counts).
constexpr int kSharedCounts = 512;
constexpr int64_t kBadKey = LLONG_MAX;  // above every packed key: check_grid_volume keeps them below 2^63 - 1
typedef unsigned long long ull;

__device__ __forceinline__ bool row_in_grid(const int32_t* row, const ConvGeometry& g, int64_t batch_size) {
  bool ok = row[0] >= 0 && row[0] < batch_size;
  for (int d = 0; d < g.ndim; ++d) ok = ok && row[1 + d] >= 0 && row[1 + d] < g.in_shape[d];
  return ok;
}

__global__ void map_init_kernel(const int32_t* indices, int64_t n, ConvGeometry g, int64_t batch_size,
                                ConvMapBuffers b) {
  const int w = g.ndim + 1;
  const int64_t kvol = g.kvol, first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x,
                step = int64_t(gridDim.x) * blockDim.x;
  for (int64_t i = first; i < n; i += step) {
    const int32_t* row = indices + i * w;
    b.in_keys[i] = row_in_grid(row, g, batch_size) ? pack_key(row[0], row + 1, g.in_shape, g.ndim) : kBadKey;
  }
  for (int64_t s = first; s < b.cap; s += step) {
    b.hkeys[s] = -1;
    b.hvisit[s] = ~ull{0};
  }
  for (int64_t t = first; t < kMapCounts + kvol; t += step) b.status[t] = t == kMapBadRow ? LLONG_MAX : 0;
  for (int64_t t = first; t <= kvol; t += step) b.offsets[t] = 0;
}

__global__ void map_insert_kernel(const int32_t* indices, const int64_t* sorted_keys, const int64_t* order,
                                  int64_t n, ConvGeometry g, bool transpose, ConvMapBuffers b) {
  __shared__ ull block_counts[kSharedCounts];
  __shared__ ull block_outputs;
  const int64_t kvol = g.kvol, shared_k = kvol < kSharedCounts ? kvol : kSharedCounts;
  for (int64_t k = threadIdx.x; k < shared_k; k += blockDim.x) block_counts[k] = 0;
  if (threadIdx.x == 0) block_outputs = 0;
  __syncthreads();
  const int w = g.ndim + 1;
  const int64_t total = n * kvol;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / kvol, k = v - r * kvol;
    const int64_t key = sorted_keys[r];
    int64_t slot = -1;
    if (key == kBadKey) {  // outside the grid: no candidates; the glue raises naming the first such row
      if (k == 0) atomicMin(reinterpret_cast<ull*>(b.status + kMapBadRow), static_cast<ull>(order[r]));
    } else {
      if (k == 0 && r > 0 && sorted_keys[r - 1] == key) atomicExch(reinterpret_cast<ull*>(b.status + kMapDupRow), 1ull);
      const int32_t* row = indices + order[r] * w;
      int32_t koff[kMaxDim], o[kMaxDim];
      unravel_offset(k, g.ksize, g.ndim, koff);
      const bool ok = transpose ? deconv_output(g, row + 1, koff, o) : conv_output(g, row + 1, koff, o);
      if (ok) {
        bool inserted;
        slot = hash_insert(b.hkeys, b.cap, pack_key(row[0], o, g.out_shape, g.ndim), &inserted);
        if (slot < 0) {
          atomicExch(reinterpret_cast<ull*>(b.status + kMapFull), 1ull);
        } else {
          atomicMin(b.hvisit + slot, static_cast<ull>(v));
          if (inserted) atomicAdd(&block_outputs, 1ull);
          if (k < kSharedCounts)
            atomicAdd(block_counts + k, 1ull);
          else
            atomicAdd(reinterpret_cast<ull*>(b.status + kMapCounts + k), 1ull);
        }
      }
    }
    b.slot[v] = slot;
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < shared_k; k += blockDim.x)
    if (block_counts[k] != 0) atomicAdd(reinterpret_cast<ull*>(b.status + kMapCounts + k), block_counts[k]);
  if (threadIdx.x == 0 && block_outputs != 0) atomicAdd(reinterpret_cast<ull*>(b.status + kMapNumOut), block_outputs);
}

__global__ void map_flags_kernel(const int64_t* order, int64_t n, int64_t kvol, ConvMapBuffers b) {
  if (blockIdx.x == 0 && threadIdx.x == 0) {  // pair_offsets: kvol steps, once per map
    int64_t run = 0;
    b.offsets[0] = 0;
    for (int64_t k = 0; k < kvol; ++k) {
      run += b.status[kMapCounts + k];
      b.offsets[k + 1] = run;
    }
  }
  const int64_t total = n * kvol;
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / kvol, k = v - r * kvol;
    const int64_t s = b.slot[v];
    b.flags[v] = s >= 0 && b.hvisit[s] == static_cast<ull>(v);
    b.flags[total + k * n + order[r]] = s >= 0;
  }
}

__global__ void map_write_kernel(const int64_t* order, const int64_t* scan, int64_t n, ConvGeometry g,
                                 int64_t num_out, ConvMapBuffers b, int32_t* table, int32_t* pair_in,
                                 int32_t* pair_out, int32_t* out_indices, int32_t* out_table) {
  const int w = g.ndim + 1;
  const int64_t kvol = g.kvol, total = n * kvol, npairs = b.offsets[kvol];
  for (int64_t v = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; v < total; v += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = v / kvol, k = v - r * kvol, row = order[r];
    const int64_t s = b.slot[v];
    int32_t id = -1;
    if (s >= 0) {
      const ull first = b.hvisit[s];
      id = static_cast<int32_t>(scan[first] - 1);
      // The buffers were sized from the counts; the bounds only matter if they disagreed with the flags.
      if (first == static_cast<ull>(v) && id >= 0 && id < num_out) {  // the first visit decodes the coordinates
        int64_t key = b.hkeys[s];
        int32_t* out = out_indices + int64_t(id) * w;
        for (int d = g.ndim - 1; d >= 0; --d) {
          out[1 + d] = static_cast<int32_t>(key % g.out_shape[d]);
          key /= g.out_shape[d];
        }
        out[0] = static_cast<int32_t>(key);
      }
      const int64_t p = scan[total + k * n + row] - 1 - num_out;
      if (p >= 0 && p < npairs) {
        pair_in[p] = static_cast<int32_t>(row);
        pair_out[p] = id;
      }
      if (out_table && id >= 0 && id < num_out) out_table[int64_t(id) * kvol + k] = static_cast<int32_t>(row);
    }
    table[row * kvol + k] = id;
  }
}

}  // namespace

const char* error_string(int code) { return hipGetErrorString(static_cast<hipError_t>(code)); }

int64_t hash_capacity(int64_t expected) {
  int64_t cap = 16;
  while (cap < 2 * expected) cap <<= 1;
  return cap;
}

int conv_map_init(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size,
                  const ConvMapBuffers& b, void* stream) {
  int64_t total = n > b.cap ? n : b.cap;
  if (kMapCounts + g.kvol > total) total = kMapCounts + g.kvol;
  launch_kernel(map_init_kernel, grid_1d(total, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), indices, n,
      g, batch_size, b);
  return last_launch_error();
}

int conv_map_insert(const int32_t* indices, const int64_t* sorted_keys, const int64_t* order, int64_t n,
                    const ConvGeometry& g, bool transpose, const ConvMapBuffers& b, void* stream) {
  if (n <= 0 || g.kvol <= 0) return 0;  // the init kernel left every count at 0
  launch_kernel(map_insert_kernel, grid_1d(n * g.kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      indices, sorted_keys, order, n, g, transpose, b);
  return last_launch_error();
}

int conv_map_flags(const int64_t* order, int64_t n, int64_t kvol, const ConvMapBuffers& b, void* stream) {
  if (n <= 0 || kvol <= 0) return 0;  // no pairs: the init kernel's offsets (all 0) stand
  launch_kernel(map_flags_kernel, grid_1d(n * kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), order,
      n, kvol, b);
  return last_launch_error();
}

int conv_map_write(const int64_t* order, const int64_t* scan, int64_t n, const ConvGeometry& g, int64_t num_out,
                   const ConvMapBuffers& b, int32_t* table, int32_t* pair_in, int32_t* pair_out,
                   int32_t* out_indices, int32_t* out_table, void* stream) {
  if (n <= 0 || g.kvol <= 0) return 0;
  launch_kernel(map_write_kernel, grid_1d(n * g.kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      order, scan, n, g, num_out, b, table, pair_in, pair_out, out_indices, out_table);
  return last_launch_error();
}

}  // namespace gpu
}  // namespace spconv
