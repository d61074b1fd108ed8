// Submanifold kernel maps in three kernels and no host read: a SubM layer's outputs are its inputs, so no
// buffer depends on the map's size. init clears the buffers, insert puts every input row in the coordinate
// hash table (checking its coordinates on the device), probe looks up the neighbours and writes the out->in
// neighbour table, the fused route's row masks and their sort keys, and the pairs per offset; its last block
// turns those counts into pair_offsets. With odd kernel sizes the map is symmetric (offset kvol - 1 - k is
// offset k negated): each hit of offsets 0..kvol/2 also gives its mirror, so only half the lookups run.
// Every result is an integer written once or a sum / OR of integers: deterministic whatever the order.
#include "hip_compat.h"

#include <climits>

#include "coord_hash.h"
#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Per-block pair counts of the first offsets, in shared memory (the rest are added to the global counts).
constexpr int kSharedCounts = 512;
typedef unsigned long long ull;

// Whether row's batch index and coordinates lie in [0, batch_size) x in_shape (else it is not inserted).
__device__ __forceinline__ bool row_in_grid(const int32_t* row, const ConvGeometry& g, int64_t batch_size) {
  bool ok = row[0] >= 0 && row[0] < batch_size;
  for (int d = 0; d < g.ndim; ++d) ok = ok && row[1 + d] >= 0 && row[1 + d] < g.in_shape[d];
  return ok;
}

__global__ void subm_init_kernel(SubmMapBuffers b, int64_t n, int64_t kvol) {
  const int64_t nbr_count = n * kvol, mask_count = b.masks ? b.splits * n : 0;
  int64_t total = b.cap > nbr_count ? b.cap : nbr_count;
  if (mask_count > total) total = mask_count;
  if (kvol + 1 > total) total = kvol + 1;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    if (t < b.cap) b.hkeys[t] = -1;
    if (t < nbr_count) b.nbr[t] = -1;
    if (t < mask_count) {
      b.masks[t] = 0;
      b.sort_keys[t] = 0;
    }
    if (t <= kvol) b.offsets[t] = 0;
    if (t < kSubmStatusSize) b.status[t] = (t == kSubmBadRow || t == kSubmDupRow) ? INT32_MAX : 0;
  }
}

__global__ void subm_insert_kernel(const int32_t* indices, int64_t n, ConvGeometry g, int64_t batch_size,
                                   SubmMapBuffers b) {
  const int w = g.ndim + 1;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t* row = indices + i * w;
    if (!row_in_grid(row, g, batch_size)) {
      atomicMin(b.status + kSubmBadRow, static_cast<int32_t>(i));
      continue;
    }
    bool inserted;
    const int64_t slot = hash_insert(b.hkeys, b.cap, pack_key(row[0], row + 1, g.in_shape, g.ndim), &inserted);
    if (slot < 0)
      atomicExch(b.status + kSubmFull, 1);
    else if (inserted)
      b.hvals[slot] = static_cast<int32_t>(i);
    else
      atomicMin(b.status + kSubmDupRow, static_cast<int32_t>(i));
  }
}

// Row `out` takes input `in` through offset k: the table entry, the row's mask bit in the split holding k
// (masks[s] bit (k - k0) / gs, as fused_map_masks sets it), and one pair of offset k.
__device__ __forceinline__ void record_pair(const SubmMapBuffers& b, int64_t n, int64_t kvol, int64_t out, int64_t k,
                                            int32_t in, ull* block_counts) {
  b.nbr[out * kvol + k] = in;
  if (k < kSharedCounts)
    atomicAdd(block_counts + k, 1ull);
  else
    atomicAdd(reinterpret_cast<ull*>(b.offsets + k + 1), 1ull);
  if (b.masks == nullptr) return;
  int s = b.splits - 1;
  while (s > 0 && s * kvol / b.splits > k) --s;
  const int64_t k0 = s * kvol / b.splits, k1 = (s + 1) * kvol / b.splits;
  const int64_t gs = (k1 - k0 + 31) / 32 > 0 ? (k1 - k0 + 31) / 32 : 1;
  const unsigned int bit = 1u << ((k - k0) / gs);
  atomicOr(reinterpret_cast<unsigned int*>(b.masks + s * n + out), bit);
  atomicOr(b.sort_keys + s * n + out, static_cast<ull>(bit));
}

// Thread t looks up offset t % span of row t / span (span = kvol, or kvol / 2 + 1 for a mirrored map).
__global__ void subm_probe_kernel(const int32_t* indices, int64_t n, ConvGeometry g, int64_t batch_size,
                                  SubmMapBuffers b, int64_t span, bool mirrored) {
  __shared__ ull block_counts[kSharedCounts];
  __shared__ bool last_block;
  const int64_t kvol = g.kvol, shared_k = kvol < kSharedCounts ? kvol : kSharedCounts;
  for (int64_t k = threadIdx.x; k < shared_k; k += blockDim.x) block_counts[k] = 0;
  __syncthreads();
  const int w = g.ndim + 1;
  const int64_t total = n * span;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t i = t / span, k = t - i * span;
    const int32_t* row = indices + i * w;
    if (!row_in_grid(row, g, batch_size)) continue;  // reported by the insert kernel
    int32_t koff[kMaxDim], nb[kMaxDim];
    unravel_offset(k, g.ksize, g.ndim, koff);
    if (!subm_neighbor(g, row + 1, koff, nb)) continue;
    const int64_t slot = hash_find(b.hkeys, b.cap, pack_key(row[0], nb, g.in_shape, g.ndim));
    if (slot < 0) continue;
    const int32_t j = b.hvals[slot];
    record_pair(b, n, kvol, i, k, j, block_counts);
    if (mirrored && k != kvol - 1 - k) record_pair(b, n, kvol, j, kvol - 1 - k, static_cast<int32_t>(i), block_counts);
  }
  __syncthreads();
  for (int64_t k = threadIdx.x; k < shared_k; k += blockDim.x)
    if (block_counts[k] != 0) atomicAdd(reinterpret_cast<ull*>(b.offsets + k + 1), block_counts[k]);
  __threadfence();
  __syncthreads();
  if (threadIdx.x == 0) last_block = atomicAdd(b.status + kSubmBlocksDone, 1) == static_cast<int>(gridDim.x) - 1;
  __syncthreads();
  if (!last_block || threadIdx.x != 0) return;
  // Every other block has added its counts: the prefix sums (kvol steps, once per map).
  __threadfence();
  int64_t run = 0;
  for (int64_t k = 0; k < kvol; ++k) {
    run += static_cast<int64_t>(atomicAdd(reinterpret_cast<ull*>(b.offsets + k + 1), 0ull));
    b.offsets[k + 1] = run;
  }
}

}  // namespace

int subm_map_init(const SubmMapBuffers& b, int64_t n, int64_t kvol, void* stream) {
  int64_t work = b.cap > n * kvol ? b.cap : n * kvol;
  if (kvol + 1 > work) work = kvol + 1;
  launch_kernel(subm_init_kernel, grid_1d(work, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), b, n,
      kvol);
  return last_launch_error();
}

int subm_map_insert(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size,
                    const SubmMapBuffers& b, void* stream) {
  if (n <= 0) return 0;
  launch_kernel(subm_insert_kernel, grid_1d(n, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), indices, n,
      g, batch_size, b);
  return last_launch_error();
}

int subm_map_probe(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size, bool mirrored,
                   const SubmMapBuffers& b, void* stream) {
  const int64_t span = mirrored ? g.kvol / 2 + 1 : g.kvol;
  if (n <= 0 || g.kvol <= 0) return 0;  // the init kernel left every count at 0
  launch_kernel(subm_probe_kernel, grid_1d(n * span, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      indices, n, g, batch_size, b, span, mirrored);
  return last_launch_error();
}

}  // namespace gpu
}  // namespace spconv
