// Point cloud -> voxels on the GPU, deterministic and identical to the CPU route
// (csrc/native/point_to_voxel.cpp): voxels in first-point order, points in point order within a voxel.
// Plan (the glue in csrc/ops/gpu/voxel_kernel.cpp runs the scan and the stable sort with ATen):
//   p2v_first_points: voxel key per point; a hash table keeps the smallest point index of every key.
//   [glue] rank = inclusive scan of the first-point flags.
//   p2v_assign:       voxel id = rank - 1 for first points; indices; pc_voxel_id for every point.
//   [glue] stable sort of pc_voxel_id (points of one voxel become contiguous, in point order).
//   p2v_fill:         slot = position within the voxel's run; copy rows; counts; optional empty mean.
#include "hip_compat.h"
#include "launchers.h"
#include "spconv/coords.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kP2VMaxDim = 4;
constexpr int kThreads = 256;

struct VoxelGrid {
  int ndim;
  float vsize[kP2VMaxDim];
  float lo[kP2VMaxDim];
  int32_t grid[kP2VMaxDim];
};

// Same arithmetic as the CPU route: floor((p - lo) / vsize) in the points' precision (IEEE division:
// nvcc's default, and hipcc's correctly rounded fp32 division default).
template <typename T>
__device__ __forceinline__ int64_t point_key(const T* p, const VoxelGrid& g) {
  int64_t key = 0;
  for (int j = 0; j < g.ndim; ++j) {
    const T q = floor((p[g.ndim - 1 - j] - static_cast<T>(g.lo[j])) / static_cast<T>(g.vsize[j]));
    if (!(q >= T(0) && q < static_cast<T>(g.grid[j]))) return -1;  // also rejects NaN
    key = key * g.grid[j] + static_cast<int64_t>(q);
  }
  return key;
}

__device__ __forceinline__ int64_t slot_start(int64_t key, int64_t cap) {
  return static_cast<int64_t>(hash_key(key) % static_cast<uint64_t>(cap));
}

// Slot of key (inserting it when absent), or -1 when the table is full (cap >= 2n rules that out).
__device__ int64_t table_insert(int64_t* hkeys, int64_t cap, int64_t key) {
  int64_t s = slot_start(key, cap);
  for (int64_t step = 0; step < cap; ++step) {
    const unsigned long long prev = atomicCAS(reinterpret_cast<unsigned long long*>(hkeys + s),
                                              static_cast<unsigned long long>(-1LL),
                                              static_cast<unsigned long long>(key));
    if (static_cast<int64_t>(prev) == -1 || static_cast<int64_t>(prev) == key) return s;
    s = s + 1 == cap ? 0 : s + 1;
  }
  return -1;
}

__device__ int64_t table_find(const int64_t* hkeys, int64_t cap, int64_t key) {
  int64_t s = slot_start(key, cap);
  for (int64_t step = 0; step < cap; ++step) {
    const int64_t k = hkeys[s];
    if (k == key) return s;
    if (k == -1) return -1;
    s = s + 1 == cap ? 0 : s + 1;
  }
  return -1;
}

template <typename T>
__global__ void p2v_keys_kernel(const T* points, int64_t n, int64_t c, VoxelGrid g, int64_t* keys, int64_t* hkeys,
                                int32_t* hvals, int64_t cap) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t key = point_key(points + i * c, g);
    keys[i] = key;
    if (key < 0) continue;
    const int64_t s = table_insert(hkeys, cap, key);
    if (s >= 0) atomicMin(hvals + s, static_cast<int32_t>(i));
  }
}

__global__ void p2v_first_kernel(const int64_t* keys, int64_t n, const int64_t* hkeys, const int32_t* hvals,
                                 int64_t cap, int32_t* first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int32_t f = 0;
    if (keys[i] >= 0) {
      const int64_t s = table_find(hkeys, cap, keys[i]);
      f = s >= 0 && hvals[s] == static_cast<int32_t>(i);
    }
    first[i] = f;
  }
}

// First points turn their slot's value from "first point" into "voxel id" and write the coordinates.
__global__ void p2v_number_kernel(const int64_t* keys, int64_t n, const int32_t* first, const int32_t* rank,
                                  const int64_t* hkeys, int32_t* hvals, int64_t cap, int64_t max_voxels, VoxelGrid g,
                                  int32_t* indices) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    if (!first[i]) continue;
    const int32_t v = rank[i] - 1;
    const int64_t s = table_find(hkeys, cap, keys[i]);
    if (s >= 0) hvals[s] = v;
    if (v >= max_voxels) continue;
    int64_t key = keys[i];
    for (int j = g.ndim - 1; j >= 0; --j) {
      indices[static_cast<int64_t>(v) * g.ndim + j] = static_cast<int32_t>(key % g.grid[j]);
      key /= g.grid[j];
    }
  }
}

__global__ void p2v_voxel_id_kernel(const int64_t* keys, int64_t n, const int64_t* hkeys, const int32_t* hvals,
                                    int64_t cap, int64_t max_voxels, int64_t* pc_voxel_id) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    int64_t id = -1;
    if (keys[i] >= 0) {
      const int64_t s = table_find(hkeys, cap, keys[i]);
      if (s >= 0 && hvals[s] < max_voxels) id = hvals[s];
    }
    pc_voxel_id[i] = id;
  }
}

__global__ void p2v_run_start_kernel(const int64_t* sorted_vid, int64_t n, int64_t* seg_start) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t v = sorted_vid[p];
    if (v >= 0 && (p == 0 || sorted_vid[p - 1] != v)) seg_start[v] = p;
  }
}

template <typename T>
__global__ void p2v_scatter_kernel(const T* points, int64_t c, const int64_t* sorted_vid, const int64_t* perm,
                                   int64_t n, int64_t max_points, const int64_t* seg_start, T* voxels,
                                   int32_t* num_per_voxel) {
  for (int64_t p = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t v = sorted_vid[p];
    if (v < 0) continue;
    const int64_t slot = p - seg_start[v];
    if (slot < max_points) {
      const T* src = points + perm[p] * c;
      T* dst = voxels + (v * max_points + slot) * c;
      for (int64_t k = 0; k < c; ++k) dst[k] = src[k];
    }
    if (p == n - 1 || sorted_vid[p + 1] != v)
      num_per_voxel[v] = static_cast<int32_t>(slot + 1 < max_points ? slot + 1 : max_points);
  }
}

// One thread per (voxel, feature); sums in double in row order, exactly as the CPU route.
template <typename T>
__global__ void p2v_mean_kernel(T* voxels, const int32_t* num_per_voxel, int64_t m, int64_t max_points,
                                int64_t c) {
  for (int64_t t = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; t < m * c;
       t += static_cast<int64_t>(blockDim.x) * gridDim.x) {
    const int64_t v = t / c, k = t % c;
    const int64_t num = num_per_voxel[v];
    if (num <= 0 || num >= max_points) continue;
    T* col = voxels + v * max_points * c + k;
    double sum = 0.0;
    for (int64_t j = 0; j < num; ++j) sum += static_cast<double>(col[j * c]);
    const T mean = static_cast<T>(sum / static_cast<double>(num));
    for (int64_t j = num; j < max_points; ++j) col[j * c] = mean;
  }
}

VoxelGrid make_grid(int ndim, const float* vsize, const float* lo, const int32_t* grid) {
  VoxelGrid g{};
  g.ndim = ndim;
  for (int j = 0; j < ndim && j < kP2VMaxDim; ++j) {
    g.vsize[j] = vsize[j];
    g.lo[j] = lo[j];
    g.grid[j] = grid[j];
  }
  return g;
}

}  // namespace

int p2v_first_points(DType t, const void* points, int64_t n, int64_t c, int ndim, const float* vsize,
                     const float* lo, const int32_t* grid, int64_t* keys, int64_t* hkeys, int32_t* hvals,
                     int64_t cap, int32_t* first, void* stream) {
  if (n == 0) return 0;
  if (ndim < 1 || ndim > kP2VMaxDim || (t != DType::F32 && t != DType::F64) || cap < 1)
    return static_cast<int>(hipErrorInvalidValue);
  const VoxelGrid g = make_grid(ndim, vsize, lo, grid);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  if (t == DType::F32)
    launch_kernel(p2v_keys_kernel<float>, blocks, kThreads, 0, s, static_cast<const float*>(points), n, c, g, keys,
        hkeys, hvals, cap);
  else
    launch_kernel(p2v_keys_kernel<double>, blocks, kThreads, 0, s, static_cast<const double*>(points), n, c, g, keys,
        hkeys, hvals, cap);
  SPCONV_RETURN_IF_ERROR(last_launch_error());
  launch_kernel(p2v_first_kernel, blocks, kThreads, 0, s, keys, n, hkeys, hvals, cap, first);
  return last_launch_error();
}

int p2v_assign(const int64_t* keys, int64_t n, const int32_t* first, const int32_t* rank, const int64_t* hkeys,
               int32_t* hvals, int64_t cap, int64_t max_voxels, int ndim, const int32_t* grid, int32_t* indices,
               int64_t* pc_voxel_id, void* stream) {
  if (n == 0) return 0;
  if (ndim < 1 || ndim > kP2VMaxDim || cap < 1) return static_cast<int>(hipErrorInvalidValue);
  const float zeros[kP2VMaxDim] = {0.f, 0.f, 0.f, 0.f};
  const VoxelGrid g = make_grid(ndim, zeros, zeros, grid);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  launch_kernel(p2v_number_kernel, blocks, kThreads, 0, s, keys, n, first, rank, hkeys, hvals, cap, max_voxels, g,
      indices);
  SPCONV_RETURN_IF_ERROR(last_launch_error());
  launch_kernel(p2v_voxel_id_kernel, blocks, kThreads, 0, s, keys, n, hkeys, hvals, cap, max_voxels, pc_voxel_id);
  return last_launch_error();
}

int p2v_fill(DType t, const void* points, int64_t c, const int64_t* sorted_vid, const int64_t* perm, int64_t n,
             int64_t m, int64_t max_points, bool empty_mean, int64_t* seg_start, void* voxels,
             int32_t* num_per_voxel, void* stream) {
  if (n == 0 || m == 0) return 0;
  if (t != DType::F32 && t != DType::F64) return static_cast<int>(hipErrorInvalidValue);
  hipStream_t s = static_cast<hipStream_t>(stream);
  const int blocks = grid_1d(n, kThreads);
  launch_kernel(p2v_run_start_kernel, blocks, kThreads, 0, s, sorted_vid, n, seg_start);
  SPCONV_RETURN_IF_ERROR(last_launch_error());
  const int mean_blocks = grid_1d(m * c, kThreads);
  if (t == DType::F32) {
    launch_kernel(p2v_scatter_kernel<float>, blocks, kThreads, 0, s, static_cast<const float*>(points), c, sorted_vid,
        perm, n, max_points, seg_start, static_cast<float*>(voxels), num_per_voxel);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
    if (empty_mean && c > 0)
      launch_kernel(p2v_mean_kernel<float>, mean_blocks, kThreads, 0, s, static_cast<float*>(voxels), num_per_voxel,
          m, max_points, c);
  } else {
    launch_kernel(p2v_scatter_kernel<double>, blocks, kThreads, 0, s, static_cast<const double*>(points), c,
        sorted_vid, perm, n, max_points, seg_start, static_cast<double*>(voxels), num_per_voxel);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
    if (empty_mean && c > 0)
      launch_kernel(p2v_mean_kernel<double>, mean_blocks, kThreads, 0, s, static_cast<double*>(voxels), num_per_voxel,
          m, max_points, c);
  }
  return last_launch_error();
}

}  // namespace gpu
}  // namespace spconv
