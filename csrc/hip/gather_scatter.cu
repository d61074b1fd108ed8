// Gather, scatter-add and sum kernels around the vendor GEMM (native GPU route, grouped convs). Within one
// kernel offset each row index appears at most once, so a scatter-add per offset needs no atomics, and a row's
// products can be found by (row, offset) in a position table and summed in offset order: the per-offset
// scatter-adds' bits in one launch.
#include "hip_compat.h"

#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;

template <typename T>
__global__ void gather_kernel(const T* __restrict__ src, int64_t c, const int32_t* __restrict__ idx, int64_t m,
                              T* __restrict__ dst) {
  const int64_t total = m * c;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / c, j = t - r * c;
    dst[t] = src[static_cast<int64_t>(idx[r]) * c + j];
  }
}

template <typename S> __device__ __forceinline__ double load_acc(const S* p) { return to_float(*p); }
template <> __device__ __forceinline__ double load_acc<double>(const double* p) { return *p; }

template <typename S, typename A>
__global__ void scatter_add_kernel(const S* __restrict__ src, int64_t c, const int32_t* __restrict__ idx, int64_t m,
                                   A* __restrict__ acc) {
  const int64_t total = m * c;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / c, j = t - r * c;
    A* d = acc + static_cast<int64_t>(idx[r]) * c + j;
    *d = *d + static_cast<A>(load_acc<S>(src + t));
  }
}

// pos[dst[p], k] = p - offsets[k] for every pair p, k its offset (the largest k with offsets[k] <= p); a row
// outside [0, n_dst) is skipped (the table is made apart from the op that checks its map).
__global__ void pair_position_kernel(const int32_t* __restrict__ dst, const int64_t* __restrict__ offsets,
                                     int64_t kvol, int64_t npairs, int64_t n_dst, int32_t* __restrict__ pos) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < npairs; p += int64_t(gridDim.x) * blockDim.x) {
    int64_t lo = 0, hi = kvol - 1;
    while (lo < hi) {
      const int64_t mid = (lo + hi + 1) / 2;
      if (offsets[mid] <= p) lo = mid; else hi = mid - 1;
    }
    const int64_t d = dst[p];
    if (d >= 0 && d < n_dst) pos[d * kvol + lo] = static_cast<int32_t>(p - offsets[lo]);
  }
}

// acc[o, j] (=, or += with accumulate) the sum over offsets k0 <= k < k1, ascending, of src[offsets[k] +
// pos[o, k] - base, j] where pos[o, k] >= 0: the scatter-adds of those offsets in their order, as one pass. A
// position past its offset's pairs (a caller's table of another map) is skipped, never read.
template <typename S, typename A>
__global__ void sum_rows_kernel(const S* __restrict__ src, int64_t c, const int32_t* __restrict__ pos,
                                const int64_t* __restrict__ offsets, int64_t kvol, int64_t k0, int64_t k1,
                                int64_t base, int64_t n_dst, bool accumulate, A* __restrict__ acc) {
  const int64_t total = n_dst * c;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t o = t / c, j = t - o * c;
    A sum = accumulate ? acc[t] : A(0);
    for (int64_t k = k0; k < k1; ++k) {
      const int32_t q = pos[o * kvol + k];
      if (q >= 0 && offsets[k] + q < offsets[k + 1]) sum = sum + static_cast<A>(load_acc<S>(src + (offsets[k] + q - base) * c + j));
    }
    acc[t] = sum;
  }
}

template <typename T>
int launch_gather(const void* src, int64_t c, const int32_t* idx, int64_t m, void* dst, hipStream_t s) {
  launch_kernel(gather_kernel<T>, grid_1d(m * c, kThreads), kThreads, 0, s, static_cast<const T*>(src), c, idx, m,
      static_cast<T*>(dst));
  return last_launch_error();
}

template <typename S, typename A>
int launch_scatter(const void* src, int64_t c, const int32_t* idx, int64_t m, void* acc, hipStream_t s) {
  launch_kernel(scatter_add_kernel<S, A>, grid_1d(m * c, kThreads), kThreads, 0, s, static_cast<const S*>(src), c,
      idx, m, static_cast<A*>(acc));
  return last_launch_error();
}

template <typename A>
int scatter_for_acc(DType src_t, const void* src, int64_t c, const int32_t* idx, int64_t m, void* acc,
                    hipStream_t s) {
  switch (src_t) {
    case DType::F32: return launch_scatter<float, A>(src, c, idx, m, acc, s);
    case DType::F16: return launch_scatter<__half, A>(src, c, idx, m, acc, s);
    case DType::BF16: return launch_scatter<bf16_t, A>(src, c, idx, m, acc, s);
    case DType::F64: return launch_scatter<double, A>(src, c, idx, m, acc, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

template <typename S, typename A>
int launch_sum(const void* src, int64_t c, const RowSums& r, void* acc, hipStream_t s) {
  launch_kernel(sum_rows_kernel<S, A>, grid_1d(r.n_dst * c, kThreads), kThreads, 0, s, static_cast<const S*>(src),
      c, r.pos, r.offsets, r.kvol, r.k0, r.k1, r.base, r.n_dst, r.accumulate, static_cast<A*>(acc));
  return last_launch_error();
}

template <typename A>
int sum_for_acc(DType src_t, const void* src, int64_t c, const RowSums& r, void* acc, hipStream_t s) {
  switch (src_t) {
    case DType::F32: return launch_sum<float, A>(src, c, r, acc, s);
    case DType::F16: return launch_sum<__half, A>(src, c, r, acc, s);
    case DType::BF16: return launch_sum<bf16_t, A>(src, c, r, acc, s);
    case DType::F64: return launch_sum<double, A>(src, c, r, acc, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

}  // namespace

int gather_rows(DType t, const void* src, int64_t c, const int32_t* idx, int64_t m, void* dst, void* stream) {
  if (m <= 0 || c <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (t) {
    case DType::F32: return launch_gather<float>(src, c, idx, m, dst, s);
    case DType::F64: return launch_gather<double>(src, c, idx, m, dst, s);
    case DType::F16:  // 16-bit types are moved as raw bits
    case DType::BF16: return launch_gather<uint16_t>(src, c, idx, m, dst, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

int scatter_add_rows(DType src_t, const void* src, int64_t c, const int32_t* idx, int64_t m, DType acc_t, void* acc,
                     void* stream) {
  if (m <= 0 || c <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  if (acc_t == DType::F32) return scatter_for_acc<float>(src_t, src, c, idx, m, acc, s);
  if (acc_t == DType::F64) return scatter_for_acc<double>(src_t, src, c, idx, m, acc, s);
  return static_cast<int>(hipErrorInvalidValue);
}

int pair_positions(const int32_t* dst, const int64_t* offsets, int64_t kvol, int64_t npairs, int64_t n_dst,
                   int32_t* pos, void* stream) {
  if (npairs <= 0 || kvol <= 0) return 0;
  launch_kernel(pair_position_kernel, grid_1d(npairs, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), dst,
      offsets, kvol, npairs, n_dst, pos);
  return last_launch_error();
}

int sum_rows_by_position(DType src_t, const void* src, int64_t c, const RowSums& r, DType acc_t, void* acc,
                         void* stream) {
  if (r.n_dst <= 0 || c <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  if (acc_t == DType::F32) return sum_for_acc<float>(src_t, src, c, r, acc, s);
  if (acc_t == DType::F64) return sum_for_acc<double>(src_t, src, c, r, acc, s);
  return static_cast<int>(hipErrorInvalidValue);
}

}  // namespace gpu
}  // namespace spconv
