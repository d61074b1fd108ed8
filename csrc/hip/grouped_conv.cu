// Grouped and depthwise convolution kernels (the fused GPU route for groups > 1), over neighbour tables.
// Forward (and dinput, on the reversed table with transposed filters): one thread per (row, output channel)
// sums its group's cig input channels over the row's offsets, in offset order, in an FP32 (FP64) register,
// and writes once: output-stationary, no atomics. Consecutive threads take consecutive channels of one row,
// so a depthwise layer's loads and stores are coalesced row segments (a memory-bound layer needs nothing else;
// not yet timed on a GPU).
// dfilter: one thread per (split of input rows, filter element) sums its rows' products into a workspace
// slot of its own; a second kernel adds the splits in split order: deterministic, no atomics.
// Filters [kvol, G, cig, cog]; features row-major contiguous; table entries outside [0, n_src) are skipped
// (the glue rejects such tables before launching).
#include "hip_compat.h"

#include "exact_math.h"
#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;

template <typename T, typename A> __device__ __forceinline__ T st(A v) { return from_float<T>(v); }
template <> __device__ __forceinline__ double st<double, double>(double v) { return v; }

// y[r, g*cog + j] = sum_k sum_c x[nbr[r, k], g*cig + c] * w[k, g, c, j].
template <typename T>
__global__ void grouped_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       const int32_t* __restrict__ nbr, int64_t n_rows, int64_t kvol, int64_t n_src,
                                       int64_t groups, int64_t cig, int64_t cog, T* __restrict__ y) {
  using A = typename AccOf<T>::type;
  const int64_t cout = groups * cog, cin = groups * cig, total = n_rows * cout;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / cout, col = t - r * cout, g = col / cog, j = col - g * cog;
    A acc = 0;
    for (int64_t k = 0; k < kvol; ++k) {
      const int64_t o = nbr[r * kvol + k];
      if (o < 0 || o >= n_src) continue;
      const T* xo = x + o * cin + g * cig;
      const T* wk = w + ((k * groups + g) * cig) * cog + j;
      for (int64_t c = 0; c < cig; ++c) acc = mul_add_rn(static_cast<A>(ld(xo[c])), static_cast<A>(ld(wk[c * cog])), acc);
    }
    y[t] = st<T, A>(acc);
  }
}

// ws[s, e] for filter element e = ((k*G + g)*cig + c)*cog + j: the sum over input rows i of split s of
// x[i, g*cig + c] * dy[nbr_t[i, k], g*cog + j]. Split s holds rows [s*n_in/S, (s+1)*n_in/S).
template <typename T>
__global__ void grouped_dfilter_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                       const int32_t* __restrict__ nbr_t, int64_t n_in, int64_t kvol, int64_t n_dst,
                                       int64_t groups, int64_t cig, int64_t cog, int64_t splits,
                                       typename AccOf<T>::type* __restrict__ ws) {
  using A = typename AccOf<T>::type;
  const int64_t numel = kvol * groups * cig * cog, total = splits * numel;
  const int64_t cin = groups * cig, cout = groups * cog;
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = t / numel, e = t - s * numel;
    const int64_t j = e % cog, c = (e / cog) % cig, g = (e / (cog * cig)) % groups, k = e / (cog * cig * groups);
    const int64_t i0 = s * n_in / splits, i1 = (s + 1) * n_in / splits;
    A acc = 0;
    for (int64_t i = i0; i < i1; ++i) {
      const int64_t o = nbr_t[i * kvol + k];
      if (o < 0 || o >= n_dst) continue;
      acc = mul_add_rn(static_cast<A>(ld(x[i * cin + g * cig + c])), static_cast<A>(ld(dy[o * cout + g * cog + j])),
                       acc);
    }
    ws[t] = acc;
  }
}

// dw[e] = sum over s in order of ws[s, e], rounded once to the filters' dtype.
template <typename T>
__global__ void grouped_dfilter_reduce_kernel(const typename AccOf<T>::type* __restrict__ ws, int64_t numel,
                                              int64_t splits, T* __restrict__ dw) {
  using A = typename AccOf<T>::type;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < numel; e += int64_t(gridDim.x) * blockDim.x) {
    A acc = ws[e];
    for (int64_t s = 1; s < splits; ++s) acc = acc + ws[s * numel + e];
    dw[e] = st<T, A>(acc);
  }
}

template <typename T>
int launch_forward(const void* x, const void* w, const int32_t* nbr, int64_t n_rows, int64_t kvol, int64_t n_src,
                   int64_t groups, int64_t cig, int64_t cog, void* y, hipStream_t s) {
  launch_kernel(grouped_forward_kernel<T>, grid_1d(n_rows * groups * cog, kThreads), kThreads, 0, s,
                static_cast<const T*>(x), static_cast<const T*>(w), nbr, n_rows, kvol, n_src, groups, cig, cog,
                static_cast<T*>(y));
  return last_launch_error();
}

template <typename T>
int launch_dfilter(const void* x, const void* dy, const int32_t* nbr_t, int64_t n_in, int64_t kvol, int64_t n_dst,
                   int64_t groups, int64_t cig, int64_t cog, int64_t splits, void* ws, void* dw, hipStream_t s) {
  using A = typename AccOf<T>::type;
  const int64_t numel = kvol * groups * cig * cog;
  launch_kernel(grouped_dfilter_kernel<T>, grid_1d(splits * numel, kThreads), kThreads, 0, s,
                static_cast<const T*>(x), static_cast<const T*>(dy), nbr_t, n_in, kvol, n_dst, groups, cig, cog,
                splits, static_cast<A*>(ws));
  SPCONV_RETURN_IF_ERROR(last_launch_error());
  launch_kernel(grouped_dfilter_reduce_kernel<T>, grid_1d(numel, kThreads), kThreads, 0, s,
                static_cast<const A*>(ws), numel, splits, static_cast<T*>(dw));
  return last_launch_error();
}

}  // namespace

int grouped_conv_forward(DType t, const void* x, const void* w, const int32_t* nbr, int64_t n_rows, int64_t kvol,
                         int64_t n_src, int64_t groups, int64_t cig, int64_t cog, void* y, void* stream) {
  if (n_rows <= 0 || groups * cog <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (t) {
    case DType::F32: return launch_forward<float>(x, w, nbr, n_rows, kvol, n_src, groups, cig, cog, y, s);
    case DType::F16: return launch_forward<__half>(x, w, nbr, n_rows, kvol, n_src, groups, cig, cog, y, s);
    case DType::BF16: return launch_forward<bf16_t>(x, w, nbr, n_rows, kvol, n_src, groups, cig, cog, y, s);
    case DType::F64: return launch_forward<double>(x, w, nbr, n_rows, kvol, n_src, groups, cig, cog, y, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

int grouped_conv_dfilter(DType t, const void* x, const void* dy, const int32_t* nbr_t, int64_t n_in, int64_t kvol,
                         int64_t n_dst, int64_t groups, int64_t cig, int64_t cog, int64_t splits, void* workspace,
                         void* dw, void* stream) {
  if (kvol * groups * cig * cog <= 0 || splits <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  switch (t) {
    case DType::F32:
      return launch_dfilter<float>(x, dy, nbr_t, n_in, kvol, n_dst, groups, cig, cog, splits, workspace, dw, s);
    case DType::F16:
      return launch_dfilter<__half>(x, dy, nbr_t, n_in, kvol, n_dst, groups, cig, cog, splits, workspace, dw, s);
    case DType::BF16:
      return launch_dfilter<bf16_t>(x, dy, nbr_t, n_in, kvol, n_dst, groups, cig, cog, splits, workspace, dw, s);
    case DType::F64:
      return launch_dfilter<double>(x, dy, nbr_t, n_in, kvol, n_dst, groups, cig, cog, splits, workspace, dw, s);
  }
  return static_cast<int>(hipErrorInvalidValue);
}

}  // namespace gpu
}  // namespace spconv
