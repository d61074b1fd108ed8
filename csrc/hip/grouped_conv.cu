// Grouped and depthwise convolution kernels (the fused GPU route for groups > 1), over neighbour tables.
// Forward (and dinput, on the reversed table with transposed filters): one thread per (row, V consecutive
// output columns) sums, per column, its group's cig input channels over the row's offsets, in offset order, in
// FP32 (FP64) registers, and writes once: output-stationary, no atomics. The V columns share each input value
// (one load feeds V FMAs) and read their filter values as one vector load; consecutive threads take consecutive
// columns of a row, so loads and stores are coalesced row segments. Depthwise (cig = cog = 1): the V columns are
// V groups, and the input values are a vector load too.
// dfilter: one thread per (split of input rows, V consecutive filter elements) sums its rows' products into
// workspace slots of its own; a second kernel adds the splits in split order: deterministic, no atomics.
// Sums are fused multiply-adds in a fixed order (offsets, then input channels; rows in order for dfilter), and V
// changes the schedule only: the bits depend neither on V nor on the device.
// Filters [kvol, G, cig, cog]; features row-major contiguous; table entries outside [0, n_src) are skipped
// (the glue rejects such tables before launching).
#include "hip_compat.h"

#include <initializer_list>

#include "exact_math.h"
#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
// Offsets (forward) or rows (dfilter) a thread handles per step: their table entries, then their rows, are
// requested together, so it waits for one round trip per step, not per offset; the sums keep their order.
constexpr int kChunk = 4;

template <typename T, typename A> __device__ __forceinline__ T st(A v) { return from_float<T>(v); }
template <> __device__ __forceinline__ double st<double, double>(double v) { return v; }

// V elements moved by one load or store: at most 16 bytes, at an address that is a multiple of its size
// (pick_vector checks the pointers; the strides are multiples of V).
template <typename T, int V>
struct alignas(sizeof(T) * V) Pack {
  T v[V];
};

template <typename T, int V, typename A>
__device__ __forceinline__ void load_pack(const T* p, A (&out)[V]) {
  const Pack<T, V> q = *reinterpret_cast<const Pack<T, V>*>(p);
#pragma unroll
  for (int i = 0; i < V; ++i) out[i] = static_cast<A>(ld(q.v[i]));
}

template <typename T, int V, typename A>
__device__ __forceinline__ void store_pack(T* p, const A (&in)[V]) {
  Pack<T, V> q;
#pragma unroll
  for (int i = 0; i < V; ++i) q.v[i] = st<T, A>(in[i]);
  *reinterpret_cast<Pack<T, V>*>(p) = q;
}

// Table entries are int32 rows: an entry is valid when, as an unsigned number, it is below the row count (-1
// wraps above it), and its row starts at a 32 x 32 -> 64-bit product (one instruction, not a 64-bit multiply).
__device__ __forceinline__ uint32_t valid_rows(int64_t n) {
  return n < INT32_MAX ? static_cast<uint32_t>(n) : static_cast<uint32_t>(INT32_MAX);
}
__device__ __forceinline__ int64_t row_offset(int32_t row, int64_t width) {
  return static_cast<int64_t>(row) * static_cast<int32_t>(width);
}

// y[r, g*cog + j] = sum_k sum_c x[nbr[r, k], g*cig + c] * w[k, g, c, j]. Thread: row r, columns [col, col + V),
// all in group g (cog % V == 0), or, depthwise, V groups of one column each (groups % V == 0).
template <typename T, int V, bool Depthwise>
__global__ void grouped_forward_kernel(const T* __restrict__ x, const T* __restrict__ w,
                                       const int32_t* __restrict__ nbr, int64_t n_rows, int64_t kvol, int64_t n_src,
                                       int64_t groups, int64_t cig, int64_t cog, T* __restrict__ y) {
  using A = typename AccOf<T>::type;
  const int64_t cout = groups * cog, cin = groups * cig, nvec = cout / V, total = n_rows * nvec;
  const uint32_t rows_src = valid_rows(n_src);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = t / nvec, col = (t - r * nvec) * V, g = col / cog, j = col - g * cog;
    A acc[V];
#pragma unroll
    for (int i = 0; i < V; ++i) acc[i] = 0;
    const int32_t* nr = nbr + r * kvol;
    for (int64_t k0 = 0; k0 < kvol; k0 += kChunk) {
      int32_t o[kChunk];  // -1 (invalid) past the last offset
#pragma unroll
      for (int u = 0; u < kChunk; ++u) o[u] = k0 + u < kvol ? nr[k0 + u] : -1;
      if (Depthwise) {  // input channel col + i feeds output column col + i through w[k, col + i]
        A xv[kChunk][V];
#pragma unroll
        for (int u = 0; u < kChunk; ++u)
          if (static_cast<uint32_t>(o[u]) < rows_src) load_pack<T, V>(x + row_offset(o[u], cin) + col, xv[u]);
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          if (static_cast<uint32_t>(o[u]) >= rows_src) continue;
          A wv[V];
          load_pack<T, V>(w + (k0 + u) * groups + col, wv);
#pragma unroll
          for (int i = 0; i < V; ++i) acc[i] = fma_rn(xv[u][i], wv[i], acc[i]);
        }
      } else {
#pragma unroll
        for (int u = 0; u < kChunk; ++u) {
          if (static_cast<uint32_t>(o[u]) >= rows_src) continue;
          const T* xo = x + row_offset(o[u], cin) + g * cig;
          const T* wk = w + (((k0 + u) * groups + g) * cig) * cog + j;
          for (int64_t c = 0; c < cig; ++c) {
            A wv[V];
            load_pack<T, V>(wk + c * cog, wv);
            const A xc = static_cast<A>(ld(xo[c]));
#pragma unroll
            for (int i = 0; i < V; ++i) acc[i] = fma_rn(xc, wv[i], acc[i]);
          }
        }
      }
    }
    store_pack<T, V>(y + r * cout + col, acc);
  }
}

// ws[s, e] for filter element e = ((k*G + g)*cig + c)*cog + j: the sum over input rows i of split s of
// x[i, g*cig + c] * dy[nbr_t[i, k], g*cog + j]. Split s holds rows [s*n_in/S, (s+1)*n_in/S). Thread: elements
// [e, e + V): one (k, g, c) and V columns j (cog % V == 0), or, depthwise, one k and V groups.
template <typename T, int V, bool Depthwise>
__global__ void grouped_dfilter_kernel(const T* __restrict__ x, const T* __restrict__ dy,
                                       const int32_t* __restrict__ nbr_t, int64_t n_in, int64_t kvol, int64_t n_dst,
                                       int64_t groups, int64_t cig, int64_t cog, int64_t splits,
                                       typename AccOf<T>::type* __restrict__ ws) {
  using A = typename AccOf<T>::type;
  const int64_t numel = kvol * groups * cig * cog, nvec = numel / V, total = splits * nvec;
  const int64_t cin = groups * cig, cout = groups * cog;
  const uint32_t rows_dst = valid_rows(n_dst);
  for (int64_t t = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; t < total; t += int64_t(gridDim.x) * blockDim.x) {
    const int64_t s = t / nvec, e = (t - s * nvec) * V;
    const int64_t j = e % cog, c = (e / cog) % cig, g = (e / (cog * cig)) % groups, k = e / (cog * cig * groups);
    // Row i's input values start at x + i * cin + xoff, its output gradients at dy + o * cout + yoff.
    const int64_t xoff = g * cig + c, yoff = g * cog + j;
    const int64_t i0 = s * n_in / splits, i1 = (s + 1) * n_in / splits;
    A acc[V];
#pragma unroll
    for (int v = 0; v < V; ++v) acc[v] = 0;
    // The rows' table entries and input values, kChunk rows on per step.
    const int32_t* nb = nbr_t + i0 * kvol + k;
    const T* xi = x + i0 * cin + xoff;
    for (int64_t i = i0; i < i1; i += kChunk, nb += kChunk * kvol, xi += kChunk * cin) {
      int32_t o[kChunk];  // -1 (invalid) past the split's last row
#pragma unroll
      for (int u = 0; u < kChunk; ++u) o[u] = i + u < i1 ? nb[u * kvol] : -1;
      A xv[kChunk][V], gv[kChunk][V];
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        if (static_cast<uint32_t>(o[u]) >= rows_dst) continue;
        if (Depthwise) {
          load_pack<T, V>(xi + u * cin, xv[u]);
        } else {
          const A xc = static_cast<A>(ld(xi[u * cin]));
#pragma unroll
          for (int v = 0; v < V; ++v) xv[u][v] = xc;
        }
        load_pack<T, V>(dy + row_offset(o[u], cout) + yoff, gv[u]);
      }
#pragma unroll
      for (int u = 0; u < kChunk; ++u) {
        if (static_cast<uint32_t>(o[u]) >= rows_dst) continue;
#pragma unroll
        for (int v = 0; v < V; ++v) acc[v] = fma_rn(xv[u][v], gv[u][v], acc[v]);
      }
    }
#pragma unroll
    for (int v = 0; v < V; ++v) ws[s * numel + e + v] = acc[v];
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

// The widest V (16 bytes at most) that divides `along` (the columns a thread's V elements run through: cog, or
// the groups of a depthwise layer) and to whose size every vector-accessed pointer is aligned.
template <typename T>
int pick_vector(int64_t along, std::initializer_list<const void*> pointers) {
  for (int v = static_cast<int>(16 / sizeof(T)); v > 1; v /= 2) {
    const uintptr_t bytes = static_cast<uintptr_t>(v) * sizeof(T);
    bool aligned = along % v == 0;
    for (const void* p : pointers) aligned = aligned && reinterpret_cast<uintptr_t>(p) % bytes == 0;
    if (aligned) return v;
  }
  return 1;
}

// Table index of a vector width 1, 2, 4, 8; widths past 16 bytes of T (never picked) take the widest one.
inline int vector_index(int v) { return v >= 8 ? 3 : v >= 4 ? 2 : v >= 2 ? 1 : 0; }
template <typename T>
constexpr int vector_cap(int v) {
  return v < static_cast<int>(16 / sizeof(T)) ? v : static_cast<int>(16 / sizeof(T));
}

template <typename T, int V, bool D>
int forward_with(const void* x, const void* w, const int32_t* nbr, int64_t n_rows, int64_t kvol, int64_t n_src,
                 int64_t groups, int64_t cig, int64_t cog, void* y, hipStream_t s) {
  launch_kernel(grouped_forward_kernel<T, V, D>, grid_1d(n_rows * (groups * cog / V), kThreads), kThreads, 0, s,
                static_cast<const T*>(x), static_cast<const T*>(w), nbr, n_rows, kvol, n_src, groups, cig, cog,
                static_cast<T*>(y));
  return last_launch_error();
}

template <typename T, int V, bool D>
int dfilter_with(const void* x, const void* dy, const int32_t* nbr_t, int64_t n_in, int64_t kvol, int64_t n_dst,
                 int64_t groups, int64_t cig, int64_t cog, int64_t splits, void* ws, hipStream_t s) {
  using A = typename AccOf<T>::type;
  launch_kernel(grouped_dfilter_kernel<T, V, D>, grid_1d(splits * (kvol * groups * cig * cog / V), kThreads),
                kThreads, 0, s, static_cast<const T*>(x), static_cast<const T*>(dy), nbr_t, n_in, kvol, n_dst, groups,
                cig, cog, splits, static_cast<A*>(ws));
  return last_launch_error();
}

// kernels[depthwise][vector_index(V)]: every (V, depthwise) instance of one launcher.
#define SPCONV_VECTOR_TABLE(fn, T)                                                                      \
  {                                                                                                     \
    {fn<T, 1, false>, fn<T, vector_cap<T>(2), false>, fn<T, vector_cap<T>(4), false>,                   \
     fn<T, vector_cap<T>(8), false>},                                                                   \
    {                                                                                                   \
      fn<T, 1, true>, fn<T, vector_cap<T>(2), true>, fn<T, vector_cap<T>(4), true>, fn<T, vector_cap<T>(8), true> \
    }                                                                                                   \
  }

template <typename T>
int launch_forward(const void* x, const void* w, const int32_t* nbr, int64_t n_rows, int64_t kvol, int64_t n_src,
                   int64_t groups, int64_t cig, int64_t cog, void* y, hipStream_t s) {
  using Fn = int (*)(const void*, const void*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                     void*, hipStream_t);
  static constexpr Fn kernels[2][4] = SPCONV_VECTOR_TABLE(forward_with, T);
  const bool depthwise = cig == 1 && cog == 1;
  // Depthwise: x, w and y move V columns at a time; else w and y (x one value at a time).
  const int v = depthwise ? pick_vector<T>(groups, {x, w, y}) : pick_vector<T>(cog, {w, y});
  return kernels[depthwise][vector_index(v)](x, w, nbr, n_rows, kvol, n_src, groups, cig, cog, y, s);
}

template <typename T>
int launch_dfilter(const void* x, const void* dy, const int32_t* nbr_t, int64_t n_in, int64_t kvol, int64_t n_dst,
                   int64_t groups, int64_t cig, int64_t cog, int64_t splits, void* ws, void* dw, hipStream_t s) {
  using A = typename AccOf<T>::type;
  using Fn = int (*)(const void*, const void*, const int32_t*, int64_t, int64_t, int64_t, int64_t, int64_t, int64_t,
                     int64_t, void*, hipStream_t);
  static constexpr Fn kernels[2][4] = SPCONV_VECTOR_TABLE(dfilter_with, T);
  const bool depthwise = cig == 1 && cog == 1;
  // Depthwise: x and dy are read V columns at a time; else dy only.
  const int v = depthwise ? pick_vector<T>(groups, {x, dy}) : pick_vector<T>(cog, {dy});
  SPCONV_RETURN_IF_ERROR(
      kernels[depthwise][vector_index(v)](x, dy, nbr_t, n_in, kvol, n_dst, groups, cig, cog, splits, ws, s));
  const int64_t numel = kvol * groups * cig * cog;
  launch_kernel(grouped_dfilter_reduce_kernel<T>, grid_1d(numel, kThreads), kThreads, 0, s,
                static_cast<const A*>(ws), numel, splits, static_cast<T*>(dw));
  return last_launch_error();
}
#undef SPCONV_VECTOR_TABLE

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
