// Gather and scatter-add kernels around the vendor GEMM (native GPU route). Within one kernel offset each
// row index appears at most once, so the scatter-add needs no atomics when offsets are processed in order.
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

}  // namespace gpu
}  // namespace spconv
