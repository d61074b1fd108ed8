// Sparse max/avg pooling over a kernel map (GPU side of csrc/native/pool.cpp, same results).
// One launch per kernel offset, offsets in order on one stream: within an offset every output row and
// every input row appears at most once, so each launch is race-free without atomics, and the per-element
// order of updates is the CPU route's order (offset by offset) -> deterministic and equal to the CPU.
// Features are read in their storage type and computed in fp32 (fp64 for double) as the CPU glue does; int8
// features (max pooling forward only) are compared as floats, which is exact.
#include "hip_compat.h"

#include "exact_math.h"
#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;

// Grid-stride loop over the m * c (pair, channel) elements of one offset; 64-bit indices throughout.
#define SPCONV_POOL_LOOP(m, c)                                                                              \
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, total_ = (m) * (c); t < total_;        \
       t += int64_t(gridDim.x) * blockDim.x)

// out starts at 0 (spconv's semantics): out = max(out, x); a NaN input replaces the output and then
// sticks, since nothing compares greater than NaN and a later NaN just replaces it.
template <typename T>
__global__ void maxpool_fwd_kernel(const T* __restrict__ x, int64_t c, const int32_t* __restrict__ pin,
                                   const int32_t* __restrict__ pout, int64_t m, T* __restrict__ out) {
  SPCONV_POOL_LOOP(m, c) {
    const int64_t r = t / c, j = t - r * c;
    const T sv = x[static_cast<int64_t>(pin[r]) * c + j];
    T* d = out + static_cast<int64_t>(pout[r]) * c + j;
    const auto s = ld(sv);
    if (s > ld(*d) || s != s) *d = sv;  // selection only: storing sv is exact in every dtype
  }
}

// The gradient of (o, j) goes to the input of the first offset whose value equals the output (for a NaN
// output, the first NaN input); claimed[o * c + j] records that it has been routed.
template <typename T, typename A>
__global__ void maxpool_bwd_kernel(const T* __restrict__ x, const T* __restrict__ y, const T* __restrict__ dy,
                                   int64_t c, const int32_t* __restrict__ pin, const int32_t* __restrict__ pout,
                                   int64_t m, uint8_t* __restrict__ claimed, A* __restrict__ dx) {
  SPCONV_POOL_LOOP(m, c) {
    const int64_t r = t / c, j = t - r * c;
    const int64_t oj = static_cast<int64_t>(pout[r]) * c + j;
    if (claimed[oj]) continue;
    const int64_t ij = static_cast<int64_t>(pin[r]) * c + j;
    const A xv = ld(x[ij]), yv = ld(y[oj]);
    if (xv == yv || (xv != xv && yv != yv)) {
      dx[ij] += static_cast<A>(ld(dy[oj]));
      claimed[oj] = 1;
    }
  }
}

template <typename T, typename A>
__global__ void avgpool_sum_kernel(const T* __restrict__ x, int64_t c, const int32_t* __restrict__ pin,
                                   const int32_t* __restrict__ pout, int64_t m, A* __restrict__ acc) {
  SPCONV_POOL_LOOP(m, c) {
    const int64_t r = t / c, j = t - r * c;
    A* d = acc + static_cast<int64_t>(pout[r]) * c + j;
    *d = *d + static_cast<A>(ld(x[static_cast<int64_t>(pin[r]) * c + j]));
  }
}

// Integer counts are order-independent, so one launch over all pairs with atomics stays deterministic.
__global__ void avgpool_count_kernel(const int32_t* __restrict__ pout, int64_t npairs, int32_t* __restrict__ count) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < npairs; p += int64_t(gridDim.x) * blockDim.x)
    atomicAdd(count + pout[p], 1);
}

// acc *= 1 / count, as the CPU does (a reciprocal then a product, not a division per element).
template <typename A>
__global__ void avgpool_scale_kernel(A* __restrict__ acc, const int32_t* __restrict__ count, int64_t n_out,
                                     int64_t c) {
  SPCONV_POOL_LOOP(n_out, c) {
    const int32_t n = count[t / c];
    if (n == 0) continue;
    const A inv = A(1) / static_cast<A>(n);
    acc[t] = acc[t] * inv;
  }
}

template <typename T, typename A>
__global__ void avgpool_bwd_kernel(const T* __restrict__ dy, const int32_t* __restrict__ count, int64_t c,
                                   const int32_t* __restrict__ pin, const int32_t* __restrict__ pout, int64_t m,
                                   A* __restrict__ dx) {
  SPCONV_POOL_LOOP(m, c) {
    const int64_t r = t / c, j = t - r * c;
    const int64_t o = pout[r];
    const A inv = A(1) / static_cast<A>(count[o]);
    A* d = dx + static_cast<int64_t>(pin[r]) * c + j;
    *d = mul_add_rn(static_cast<A>(ld(dy[o * c + j])), inv, *d);
  }
}

#undef SPCONV_POOL_LOOP

// Runs launch(begin, count) for every non-empty offset, in order; stops at the first launch error.
template <typename F>
int for_each_offset(const int64_t* offsets, int64_t kvol, int64_t c, const F& launch) {
  if (c <= 0) return 0;
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t b = offsets[k], m = offsets[k + 1] - b;
    if (m <= 0) continue;
    launch(b, m);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
  }
  return 0;
}

template <typename T>
int maxpool_fwd_t(const void* xv, int64_t c, const int32_t* pin, const int32_t* pout, const int64_t* offsets,
                  int64_t kvol, void* outv, hipStream_t s) {
  const T* x = static_cast<const T*>(xv);
  T* out = static_cast<T*>(outv);
  return for_each_offset(offsets, kvol, c, [&](int64_t b, int64_t m) {
    launch_kernel(maxpool_fwd_kernel<T>, grid_1d(m * c, kThreads), kThreads, 0, s, x, c, pin + b, pout + b, m, out);
  });
}

template <typename T>
int maxpool_bwd_t(const void* xv, const void* yv, const void* dyv, int64_t c, const int32_t* pin,
                  const int32_t* pout, const int64_t* offsets, int64_t kvol, uint8_t* claimed, void* dxv,
                  hipStream_t s) {
  using A = typename AccOf<T>::type;
  const T *x = static_cast<const T*>(xv), *y = static_cast<const T*>(yv), *dy = static_cast<const T*>(dyv);
  A* dx = static_cast<A*>(dxv);
  return for_each_offset(offsets, kvol, c, [&](int64_t b, int64_t m) {
    launch_kernel(maxpool_bwd_kernel<T, A>, grid_1d(m * c, kThreads), kThreads, 0, s, x, y, dy, c, pin + b, pout + b,
        m, claimed, dx);
  });
}

template <typename T>
int avgpool_fwd_t(const void* xv, int64_t c, int64_t num_out, const int32_t* pin, const int32_t* pout,
                  const int64_t* offsets, int64_t kvol, void* accv, int32_t* count, hipStream_t s) {
  using A = typename AccOf<T>::type;
  const T* x = static_cast<const T*>(xv);
  A* acc = static_cast<A*>(accv);
  const int64_t npairs = offsets[kvol] - offsets[0];
  if (npairs > 0) {  // counted even with zero channels, as on the CPU
    launch_kernel(avgpool_count_kernel, grid_1d(npairs, kThreads), kThreads, 0, s, pout + offsets[0], npairs, count);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
  }
  SPCONV_RETURN_IF_ERROR(for_each_offset(offsets, kvol, c, [&](int64_t b, int64_t m) {
    launch_kernel(avgpool_sum_kernel<T, A>, grid_1d(m * c, kThreads), kThreads, 0, s, x, c, pin + b, pout + b, m, acc);
  }));
  if (npairs == 0 || num_out * c == 0) return 0;
  launch_kernel(avgpool_scale_kernel<A>, grid_1d(num_out * c, kThreads), kThreads, 0, s, acc, count, num_out, c);
  return last_launch_error();
}

template <typename T>
int avgpool_bwd_t(const void* dyv, const int32_t* count, int64_t c, const int32_t* pin, const int32_t* pout,
                  const int64_t* offsets, int64_t kvol, void* dxv, hipStream_t s) {
  using A = typename AccOf<T>::type;
  const T* dy = static_cast<const T*>(dyv);
  A* dx = static_cast<A*>(dxv);
  return for_each_offset(offsets, kvol, c, [&](int64_t b, int64_t m) {
    launch_kernel(avgpool_bwd_kernel<T, A>, grid_1d(m * c, kThreads), kThreads, 0, s, dy, count, c, pin + b, pout + b,
        m, dx);
  });
}

}  // namespace

#define SPCONV_POOL_DISPATCH(t, fn, ...)                            \
  switch (t) {                                                      \
    case DType::F32: return fn<float>(__VA_ARGS__);                 \
    case DType::F16: return fn<__half>(__VA_ARGS__);                \
    case DType::BF16: return fn<bf16_t>(__VA_ARGS__);               \
    case DType::F64: return fn<double>(__VA_ARGS__);                \
  }                                                                 \
  return static_cast<int>(hipErrorInvalidValue)

int maxpool_forward(DType t, const void* x, int64_t c, const int32_t* pair_in, const int32_t* pair_out,
                    const int64_t* offsets, int64_t kvol, void* out, void* stream) {
  SPCONV_POOL_DISPATCH(t, maxpool_fwd_t, x, c, pair_in, pair_out, offsets, kvol, out,
                       static_cast<hipStream_t>(stream));
}

int maxpool_backward(DType t, const void* x, const void* y, const void* dy, int64_t c, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, uint8_t* claimed, void* dx,
                     void* stream) {
  SPCONV_POOL_DISPATCH(t, maxpool_bwd_t, x, y, dy, c, pair_in, pair_out, offsets, kvol, claimed, dx,
                       static_cast<hipStream_t>(stream));
}

int avgpool_forward(DType t, const void* x, int64_t c, int64_t num_out, const int32_t* pair_in,
                    const int32_t* pair_out, const int64_t* offsets, int64_t kvol, void* acc, int32_t* count,
                    void* stream) {
  SPCONV_POOL_DISPATCH(t, avgpool_fwd_t, x, c, num_out, pair_in, pair_out, offsets, kvol, acc, count,
                       static_cast<hipStream_t>(stream));
}

int avgpool_backward(DType t, const void* dy, const int32_t* count, int64_t c, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, void* dx, void* stream) {
  SPCONV_POOL_DISPATCH(t, avgpool_bwd_t, dy, count, c, pair_in, pair_out, offsets, kvol, dx,
                       static_cast<hipStream_t>(stream));
}

#undef SPCONV_POOL_DISPATCH

int maxpool_forward_int8(const int8_t* x, int64_t c, const int32_t* pair_in, const int32_t* pair_out,
                         const int64_t* offsets, int64_t kvol, int8_t* out, void* stream) {
  return maxpool_fwd_t<int8_t>(x, c, pair_in, pair_out, offsets, kvol, out, static_cast<hipStream_t>(stream));
}

}  // namespace gpu
}  // namespace spconv
