#include "fused_gemm.h"
#include "prefetch_rows.h"
#include "weight_grad_loop.h"

#include <algorithm>
#include <array>
#include <utility>

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

#if SPCONV_HAVE_AVX2_PATH
namespace {

// The 512-bit vector of T: 16 floats or 8 doubles. Every kernel below is the same code for both.
template <typename T>
struct Vec;

template <>
struct Vec<float> {
  using V = __m512;
  static constexpr int kLanes = 16;
  SPCONV_TARGET_AVX512 static V zero() { return _mm512_setzero_ps(); }
  SPCONV_TARGET_AVX512 static V load(const float* p) { return _mm512_loadu_ps(p); }
  SPCONV_TARGET_AVX512 static V set1(float v) { return _mm512_set1_ps(v); }
  SPCONV_TARGET_AVX512 static V fmadd(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  SPCONV_TARGET_AVX512 static V add(V a, V b) { return _mm512_add_ps(a, b); }
  SPCONV_TARGET_AVX512 static void store(float* p, V v) { _mm512_storeu_ps(p, v); }
};

template <>
struct Vec<double> {
  using V = __m512d;
  static constexpr int kLanes = 8;
  SPCONV_TARGET_AVX512 static V zero() { return _mm512_setzero_pd(); }
  SPCONV_TARGET_AVX512 static V load(const double* p) { return _mm512_loadu_pd(p); }
  SPCONV_TARGET_AVX512 static V set1(double v) { return _mm512_set1_pd(v); }
  SPCONV_TARGET_AVX512 static V fmadd(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  SPCONV_TARGET_AVX512 static V add(V a, V b) { return _mm512_add_pd(a, b); }
  SPCONV_TARGET_AVX512 static void store(double* p, V v) { _mm512_storeu_pd(p, v); }
};

// 6 register rows (pairs in the forward, input channels in dW) x 4 vectors = 24 accumulators, plus 4 operand
// vectors: 28 of the 32 registers.
constexpr int kRows = 6;
constexpr int kMaxVectors = 4;

// Pairs per forward tile of NV vectors: narrower passes take more pairs, up to 24 accumulators, so that each
// weight vector serves more rows (one vector, 16 channels, gains nothing from more rows; docs/routes.md,
// "Measured choices of the CPU kernels").
constexpr int forward_rows(int nv) { return nv == 2 ? 12 : nv == 3 ? 8 : kRows; }

// One tile: `rows` (<= R) pairs starting at p, output channels [j0, j0 + lanes * NV).
template <typename T, int NV, int R = forward_rows(NV)>
SPCONV_TARGET_AVX512 inline void tile(const T* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                       int64_t rows, const T* w, int64_t cout, int64_t j0, T* y) {
  using S = Vec<T>;
  constexpr int L = S::kLanes;
  const T* xr[R];
  for (int i = 0; i < R; ++i) xr[i] = x + static_cast<int64_t>(gather[i < rows ? i : 0]) * cin;
  // Every loop over rows and vectors is unrolled (SPCONV_UNROLL) so that acc is 24 registers: otherwise GCC keeps
  // it in memory, and zeroes, stores and reloads all of it around each tile.
  typename S::V acc[R][NV];
  SPCONV_UNROLL for (int i = 0; i < R; ++i)
    SPCONV_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = S::zero();
  const T* wc = w + j0;
  for (int64_t c = 0; c < cin; ++c, wc += cout) {
    typename S::V b[NV];
    SPCONV_UNROLL for (int v = 0; v < NV; ++v) b[v] = S::load(wc + L * v);
    SPCONV_UNROLL for (int i = 0; i < R; ++i) {
      const typename S::V a = S::set1(xr[i][c]);
      SPCONV_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = S::fmadd(a, b[v], acc[i][v]);
    }
  }
  SPCONV_UNROLL for (int i = 0; i < R; ++i) {
    if (i >= rows) break;
    T* yr = y + static_cast<int64_t>(scatter[i]) * cout + j0;
    SPCONV_UNROLL for (int v = 0; v < NV; ++v) S::store(yr + L * v, S::add(S::load(yr + L * v), acc[i][v]));
  }
}

// The first column pass requests the next tile's rows while a tile computes (the dW loop has no such requests:
// there they cost time); later passes find the rows in L1/L2.
template <typename T, int NV>
SPCONV_TARGET_AVX512 void columns(const T* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                   int64_t m, const T* w, int64_t cout, int64_t j0, T* y) {
  constexpr int R = forward_rows(NV);
  const bool prefetch = j0 == 0;
  for (int64_t p = 0; p < m; p += R) {
    if (prefetch && p + R < m) prefetch_rows(x, cin, gather + p + R, std::min<int64_t>(R, m - p - R));
    tile<T, NV>(x, cin, gather + p, scatter + p, std::min<int64_t>(R, m - p), w, cout, j0, y);
  }
}

// 4 vectors of channels per pass; the rest in a narrower pass. The gathered rows of a pass stay in L1 for the
// next.
template <typename T>
void gather_gemm_scatter_columns(const T* x, int64_t cin, const int32_t* gather, const int32_t* scatter, int64_t m,
                                 const T* w, int64_t cout, T* y) {
  constexpr int64_t L = Vec<T>::kLanes, kPass = L * kMaxVectors;
  int64_t j0 = 0;
  for (; j0 + kPass <= cout; j0 += kPass) columns<T, 4>(x, cin, gather, scatter, m, w, cout, j0, y);
  switch ((cout - j0) / L) {
    case 3: columns<T, 3>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    case 2: columns<T, 2>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    case 1: columns<T, 1>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    default: break;
  }
}

// ---- the filter gradient ----

// dw rows [c0, c0 + R) x columns [j0, j0 + lanes * NV) += sum over pairs [0, m) of x[in[p], c] * dy[out[p], j],
// pairs in order, continuing each element's chain from its stored value (or from zero when `fresh`). R is a
// constant so that a pair's R broadcasts are fixed offsets from its x row (a run-time channel list would take
// six registers and reloads from the stack in every pair), and a last tile of fewer channels computes only those.
template <typename T, int NV, int R>
SPCONV_TARGET_AVX512 void dw_tile(const T* x, int64_t ldx, const T* dy, int64_t ldy, int64_t cout, const int32_t* in,
                                   const int32_t* out, int64_t m, int64_t c0, int64_t j0, bool fresh, T* dw) {
  using S = Vec<T>;
  constexpr int L = S::kLanes;
  typename S::V acc[R][NV];  // registers, as in the forward tile
  SPCONV_UNROLL for (int i = 0; i < R; ++i)
    SPCONV_UNROLL for (int v = 0; v < NV; ++v)
      acc[i][v] = fresh ? S::zero() : S::load(dw + (c0 + i) * cout + j0 + L * v);
  const T* xc = x + c0;
  const T* gc = dy + j0;
  for (int64_t p = 0; p < m; ++p) {
    const T* xr = xc + int64_t{in[p]} * ldx;
    const T* gr = gc + int64_t{out[p]} * ldy;
    typename S::V b[NV];
    SPCONV_UNROLL for (int v = 0; v < NV; ++v) b[v] = S::load(gr + L * v);
    SPCONV_UNROLL for (int i = 0; i < R; ++i) {
      const typename S::V a = S::set1(xr[i]);
      SPCONV_UNROLL for (int v = 0; v < NV; ++v) acc[i][v] = S::fmadd(a, b[v], acc[i][v]);
    }
  }
  SPCONV_UNROLL for (int i = 0; i < R; ++i)
    SPCONV_UNROLL for (int v = 0; v < NV; ++v) S::store(dw + (c0 + i) * cout + j0 + L * v, acc[i][v]);
}

using std::index_sequence;
template <typename T>
using DwTile = void (*)(const T*, int64_t, const T*, int64_t, int64_t, const int32_t*, const int32_t*, int64_t,
                        int64_t, int64_t, bool, T*);
template <typename T, int R, std::size_t... V>
constexpr std::array<DwTile<T>, kMaxVectors> dw_tiles_of_rows(index_sequence<V...>) {
  return {dw_tile<T, static_cast<int>(V) + 1, R>...};
}
// [R - 1][NV - 1]: the tile of R channels and NV vectors.
template <typename T, std::size_t... R>
constexpr std::array<std::array<DwTile<T>, kMaxVectors>, kRows> dw_tiles(index_sequence<R...>) {
  return {dw_tiles_of_rows<T, static_cast<int>(R) + 1>(std::make_index_sequence<kMaxVectors>())...};
}

template <typename T>
void weight_grad_tiles(const T* x, int64_t ldx, int64_t cin, const T* dy, int64_t ldy, int64_t cout,
                       const int32_t* in, const int32_t* out, int64_t m, bool accumulate, T* dw) {
  static constexpr auto kDwTiles = dw_tiles<T>(std::make_index_sequence<kRows>());
  constexpr int64_t L = Vec<T>::kLanes, kPass = L * kMaxVectors;
  auto tile = [&](int64_t p0, int64_t n, int64_t c0, int64_t rows, bool fresh) {
    for (int64_t j0 = 0; j0 < cout; j0 += kPass) {
      const int64_t nv = std::min(kPass, cout - j0) / L;
      kDwTiles[rows - 1][nv - 1](x, ldx, dy, ldy, cout, in + p0, out + p0, n, c0, j0, fresh, dw);
    }
  };
  const WeightGradAhead<T> ahead{x, ldx, cin, dy, ldy, cout, in, out};
  weight_grad_loop(cin, cout, m, accumulate, kRows, dw, tile, ahead);
}

}  // namespace

void fused_gather_gemm_scatter_avx512(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const float* w, int64_t cout, float* y) {
  gather_gemm_scatter_columns(x, cin, gather, scatter, m, w, cout, y);
}
void fused_gather_gemm_scatter_avx512(const double* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const double* w, int64_t cout, double* y) {
  gather_gemm_scatter_columns(x, cin, gather, scatter, m, w, cout, y);
}
void fused_weight_grad_avx512(const float* x, int64_t ldx, int64_t cin, const float* dy, int64_t ldy, int64_t cout,
                              const int32_t* in, const int32_t* out, int64_t m, bool accumulate, float* dw) {
  weight_grad_tiles(x, ldx, cin, dy, ldy, cout, in, out, m, accumulate, dw);
}
void fused_weight_grad_avx512(const double* x, int64_t ldx, int64_t cin, const double* dy, int64_t ldy,
                              int64_t cout, const int32_t* in, const int32_t* out, int64_t m, bool accumulate,
                              double* dw) {
  weight_grad_tiles(x, ldx, cin, dy, ldy, cout, in, out, m, accumulate, dw);
}
#else
void fused_gather_gemm_scatter_avx512(const float*, int64_t, const int32_t*, const int32_t*, int64_t, const float*,
                                      int64_t, float*) {}
void fused_gather_gemm_scatter_avx512(const double*, int64_t, const int32_t*, const int32_t*, int64_t,
                                      const double*, int64_t, double*) {}
void fused_weight_grad_avx512(const float*, int64_t, int64_t, const float*, int64_t, int64_t, const int32_t*,
                              const int32_t*, int64_t, bool, float*) {}
void fused_weight_grad_avx512(const double*, int64_t, int64_t, const double*, int64_t, int64_t, const int32_t*,
                              const int32_t*, int64_t, bool, double*) {}
#endif

}  // namespace native
}  // namespace spconv
