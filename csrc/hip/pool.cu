// Sparse max/avg pooling over a kernel map (GPU side of csrc/native/pool.cpp, same results).
// Over the pairs: one launch per kernel offset, offsets in order on one stream: within an offset every output
// row and every input row appears at most once, so each launch is race-free without atomics, and the
// per-element order of updates is the CPU route's order (offset by offset) -> deterministic and equal to the CPU.
// Over neighbour tables: one thread per (row, channel) walks the row's offsets in ascending order (the same
// order) and writes its element once: one launch per op, no atomics on features.
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


// ---- over neighbour tables ----

template <typename T> __device__ __forceinline__ T zero_of() { return from_float<T>(0.f); }
template <> __device__ __forceinline__ double zero_of<double>() { return 0.0; }
template <> __device__ __forceinline__ int8_t zero_of<int8_t>() { return 0; }

// The accumulator rounded to the storage dtype (round to nearest even).
template <typename T> __device__ __forceinline__ T from_acc(float v) { return from_float<T>(v); }
template <typename T> __device__ __forceinline__ T from_acc(double v) { return v; }

template <typename Tag> __device__ __forceinline__ Tag no_arg();
template <> __device__ __forceinline__ uint8_t no_arg<uint8_t>() { return 255; }
template <> __device__ __forceinline__ int32_t no_arg<int32_t>() { return -1; }

// Grid-stride loop over the rows * c (row, channel) elements; 64-bit indices throughout.
#define SPCONV_TABLE_LOOP(rows, c)                                                                          \
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x, total_ = (rows) * (c); t < total_;       \
       t += int64_t(gridDim.x) * blockDim.x)

// out = max(0, inputs in offset order), as the pair kernel's updates: a larger input or a NaN replaces the
// running value. arg = the first offset whose input equals the final output (the pair backward's rule): the
// offset of each strict increase, of the first NaN, or of the first input equal to the starting 0.
template <typename T, typename Tag, bool kArg>
__global__ void maxpool_table_fwd_kernel(const T* __restrict__ x, int64_t c, const int32_t* __restrict__ nbr,
                                         int64_t n_out, int kvol, T* __restrict__ out, Tag* __restrict__ arg) {
  SPCONV_TABLE_LOOP(n_out, c) {
    const int64_t o = t / c, j = t - o * c;
    const int32_t* row = nbr + o * kvol;
    decltype(ld(x[0])) best = 0;
    int64_t src = -1;  // the element the output copies; -1: the starting 0
    Tag a = no_arg<Tag>();
    for (int k = 0; k < kvol; ++k) {
      const int32_t i = row[k];
      if (i < 0) continue;
      const int64_t p = static_cast<int64_t>(i) * c + j;
      const auto s = ld(x[p]);
      if (s != s) {  // a NaN replaces (the last one is stored); the first one takes the gradient
        if (best == best) a = static_cast<Tag>(k);
        best = s;
        src = p;
      } else if (s > best) {
        best = s;
        src = p;
        a = static_cast<Tag>(k);
      } else if (s == best && a == no_arg<Tag>()) {
        a = static_cast<Tag>(k);
      }
    }
    out[t] = src >= 0 ? x[src] : zero_of<T>();  // selection only: exact in every dtype
    if (kArg) arg[t] = a;
  }
}

template <typename T, typename Tag>
__global__ void maxpool_table_bwd_kernel(const T* __restrict__ dy, const Tag* __restrict__ arg, int64_t c,
                                         const int32_t* __restrict__ nbr_t, int64_t n_in, int kvol,
                                         T* __restrict__ dx) {
  using A = typename AccOf<T>::type;
  SPCONV_TABLE_LOOP(n_in, c) {
    const int64_t i = t / c, j = t - i * c;
    const int32_t* row = nbr_t + i * kvol;
    A g = 0;
    for (int k = 0; k < kvol; ++k) {
      const int32_t o = row[k];
      if (o < 0) continue;
      const int64_t q = static_cast<int64_t>(o) * c + j;
      if (arg[q] == static_cast<Tag>(k)) g = g + static_cast<A>(ld(dy[q]));
    }
    dx[t] = from_acc<T>(g);
  }
}

// One thread per (output, channel) of max(c, 1) channels: channel 0 also writes the count.
template <typename T>
__global__ void avgpool_table_fwd_kernel(const T* __restrict__ x, int64_t c, const int32_t* __restrict__ nbr,
                                         int64_t n_out, int kvol, T* __restrict__ out, int32_t* __restrict__ count) {
  using A = typename AccOf<T>::type;
  const int64_t cc = c > 0 ? c : 1;
  SPCONV_TABLE_LOOP(n_out, cc) {
    const int64_t o = t / cc, j = t - o * cc;
    const int32_t* row = nbr + o * kvol;
    A acc = 0;
    int32_t n = 0;
    for (int k = 0; k < kvol; ++k) {
      const int32_t i = row[k];
      if (i < 0) continue;
      ++n;
      if (j < c) acc = acc + static_cast<A>(ld(x[static_cast<int64_t>(i) * c + j]));
    }
    if (j == 0) count[o] = n;
    if (j < c) {
      if (n > 0) acc = acc * (A(1) / static_cast<A>(n));  // a reciprocal then a product, as the CPU
      out[o * c + j] = from_acc<T>(acc);
    }
  }
}

template <typename T>
__global__ void avgpool_table_bwd_kernel(const T* __restrict__ dy, const int32_t* __restrict__ count, int64_t c,
                                         const int32_t* __restrict__ nbr_t, int64_t n_in, int kvol,
                                         T* __restrict__ dx) {
  using A = typename AccOf<T>::type;
  SPCONV_TABLE_LOOP(n_in, c) {
    const int64_t i = t / c, j = t - i * c;
    const int32_t* row = nbr_t + i * kvol;
    A g = 0;
    for (int k = 0; k < kvol; ++k) {
      const int32_t o = row[k];
      if (o < 0) continue;
      const A inv = A(1) / static_cast<A>(count[o]);
      g = mul_add_rn(static_cast<A>(ld(dy[static_cast<int64_t>(o) * c + j])), inv, g);
    }
    dx[t] = from_acc<T>(g);
  }
}

__global__ void transpose_table_kernel(const int32_t* __restrict__ table, int64_t rows, int64_t kvol,
                                       int64_t num_rows, int32_t* __restrict__ out, int32_t* __restrict__ flags) {
  SPCONV_TABLE_LOOP(rows, kvol) {
    const int32_t o = table[t];
    if (o == -1) continue;
    if (o < -1 || o >= num_rows) {
      if (flags != nullptr) flags[0] = 1;
      continue;
    }
    const int64_t r = t / kvol, k = t - r * kvol;
    int32_t* d = out + static_cast<int64_t>(o) * kvol + k;
    if (flags == nullptr) *d = static_cast<int32_t>(r);
    else if (atomicCAS(d, -1, static_cast<int32_t>(r)) != -1) flags[1] = 1;
  }
}

#undef SPCONV_TABLE_LOOP

// kvol is walked as an int: tables hold at most 2^31 - 1 columns' worth of offsets long before that matters.
template <typename T, typename Tag, bool kArg>
int maxpool_table_fwd_launch(const void* xv, int64_t c, const int32_t* nbr, int64_t n_out, int64_t kvol,
                             void* outv, void* argv, hipStream_t s) {
  if (n_out * c <= 0) return 0;
  launch_kernel(maxpool_table_fwd_kernel<T, Tag, kArg>, grid_1d(n_out * c, kThreads), kThreads, 0, s,
      static_cast<const T*>(xv), c, nbr, n_out, static_cast<int>(kvol), static_cast<T*>(outv),
      static_cast<Tag*>(argv));
  return last_launch_error();
}

template <typename T>
int maxpool_table_fwd_t(const void* x, int64_t c, const int32_t* nbr, int64_t n_out, int64_t kvol, void* out,
                        void* arg, int arg_bytes, hipStream_t s) {
  if (arg == nullptr) return maxpool_table_fwd_launch<T, uint8_t, false>(x, c, nbr, n_out, kvol, out, arg, s);
  if (arg_bytes == 1) return maxpool_table_fwd_launch<T, uint8_t, true>(x, c, nbr, n_out, kvol, out, arg, s);
  if (arg_bytes == 4) return maxpool_table_fwd_launch<T, int32_t, true>(x, c, nbr, n_out, kvol, out, arg, s);
  return static_cast<int>(hipErrorInvalidValue);
}

template <typename T, typename Tag>
int maxpool_table_bwd_launch(const void* dy, const void* arg, int64_t c, const int32_t* nbr_t, int64_t n_in,
                             int64_t kvol, void* dx, hipStream_t s) {
  if (n_in * c <= 0) return 0;
  launch_kernel(maxpool_table_bwd_kernel<T, Tag>, grid_1d(n_in * c, kThreads), kThreads, 0, s,
      static_cast<const T*>(dy), static_cast<const Tag*>(arg), c, nbr_t, n_in, static_cast<int>(kvol),
      static_cast<T*>(dx));
  return last_launch_error();
}

template <typename T>
int maxpool_table_bwd_t(const void* dy, const void* arg, int arg_bytes, int64_t c, const int32_t* nbr_t,
                        int64_t n_in, int64_t kvol, void* dx, hipStream_t s) {
  if (arg_bytes == 1) return maxpool_table_bwd_launch<T, uint8_t>(dy, arg, c, nbr_t, n_in, kvol, dx, s);
  if (arg_bytes == 4) return maxpool_table_bwd_launch<T, int32_t>(dy, arg, c, nbr_t, n_in, kvol, dx, s);
  return static_cast<int>(hipErrorInvalidValue);
}

template <typename T>
int avgpool_table_fwd_t(const void* x, int64_t c, const int32_t* nbr, int64_t n_out, int64_t kvol, void* out,
                        int32_t* count, hipStream_t s) {
  const int64_t work = n_out * (c > 0 ? c : 1);
  if (work <= 0) return 0;
  launch_kernel(avgpool_table_fwd_kernel<T>, grid_1d(work, kThreads), kThreads, 0, s, static_cast<const T*>(x), c,
      nbr, n_out, static_cast<int>(kvol), static_cast<T*>(out), count);
  return last_launch_error();
}

template <typename T>
int avgpool_table_bwd_t(const void* dy, const int32_t* count, int64_t c, const int32_t* nbr_t, int64_t n_in,
                        int64_t kvol, void* dx, hipStream_t s) {
  if (n_in * c <= 0) return 0;
  launch_kernel(avgpool_table_bwd_kernel<T>, grid_1d(n_in * c, kThreads), kThreads, 0, s, static_cast<const T*>(dy),
      count, c, nbr_t, n_in, static_cast<int>(kvol), static_cast<T*>(dx));
  return last_launch_error();
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

int maxpool_table_forward(DType t, const void* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                          void* out, void* argmax, int argmax_bytes, void* stream) {
  SPCONV_POOL_DISPATCH(t, maxpool_table_fwd_t, x, c, nbr, num_out, kvol, out, argmax, argmax_bytes,
                       static_cast<hipStream_t>(stream));
}

int maxpool_table_backward(DType t, const void* dy, const void* argmax, int argmax_bytes, int64_t c,
                           const int32_t* nbr_t, int64_t num_in, int64_t kvol, void* dx, void* stream) {
  SPCONV_POOL_DISPATCH(t, maxpool_table_bwd_t, dy, argmax, argmax_bytes, c, nbr_t, num_in, kvol, dx,
                       static_cast<hipStream_t>(stream));
}

int avgpool_table_forward(DType t, const void* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                          void* out, int32_t* count, void* stream) {
  SPCONV_POOL_DISPATCH(t, avgpool_table_fwd_t, x, c, nbr, num_out, kvol, out, count,
                       static_cast<hipStream_t>(stream));
}

int avgpool_table_backward(DType t, const void* dy, const int32_t* count, int64_t c, const int32_t* nbr_t,
                           int64_t num_in, int64_t kvol, void* dx, void* stream) {
  SPCONV_POOL_DISPATCH(t, avgpool_table_bwd_t, dy, count, c, nbr_t, num_in, kvol, dx,
                       static_cast<hipStream_t>(stream));
}

#undef SPCONV_POOL_DISPATCH

int maxpool_forward_int8(const int8_t* x, int64_t c, const int32_t* pair_in, const int32_t* pair_out,
                         const int64_t* offsets, int64_t kvol, int8_t* out, void* stream) {
  return maxpool_fwd_t<int8_t>(x, c, pair_in, pair_out, offsets, kvol, out, static_cast<hipStream_t>(stream));
}

int maxpool_table_forward_int8(const int8_t* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                               int8_t* out, void* stream) {
  return maxpool_table_fwd_launch<int8_t, uint8_t, false>(x, c, nbr, num_out, kvol, out, nullptr,
                                                          static_cast<hipStream_t>(stream));
}

int transpose_neighbour_table(const int32_t* table, int64_t rows, int64_t kvol, int64_t num_rows, int32_t* out,
                              int32_t* flags, void* stream) {
  if (rows * kvol <= 0) return 0;
  launch_kernel(transpose_table_kernel, grid_1d(rows * kvol, kThreads), kThreads, 0, static_cast<hipStream_t>(stream),
      table, rows, kvol, num_rows, out, flags);
  return last_launch_error();
}

}  // namespace gpu
}  // namespace spconv
