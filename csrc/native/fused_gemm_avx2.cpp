#include "fused_gemm.h"
#include "prefetch_rows.h"
#include "weight_grad_loop.h"

#include <algorithm>

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

#if SPCONV_HAVE_AVX2_PATH
namespace {

constexpr int kRows = 6;  // 6 rows x 16 channels = 12 accumulators, 2 filter vectors, 1 broadcast: 15 of 16

SPCONV_TARGET_AVX2 inline void add_row(float* yr, __m256 lo, __m256 hi) {
  _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), lo));
  _mm256_storeu_ps(yr + 8, _mm256_add_ps(_mm256_loadu_ps(yr + 8), hi));
}

// One tile: `rows` pairs (the rest of the kRows repeat the first), output channels [j0, j0 + 16). The
// accumulators are named variables: GCC keeps an array of twelve of them in memory and stores it at every step.
SPCONV_TARGET_AVX2 inline void tile16(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t rows, const float* w, int64_t cout, int64_t j0, float* y) {
  const float* x0 = x + static_cast<int64_t>(gather[0]) * cin;
  const float* x1 = x + static_cast<int64_t>(gather[rows > 1 ? 1 : 0]) * cin;
  const float* x2 = x + static_cast<int64_t>(gather[rows > 2 ? 2 : 0]) * cin;
  const float* x3 = x + static_cast<int64_t>(gather[rows > 3 ? 3 : 0]) * cin;
  const float* x4 = x + static_cast<int64_t>(gather[rows > 4 ? 4 : 0]) * cin;
  const float* x5 = x + static_cast<int64_t>(gather[rows > 5 ? 5 : 0]) * cin;
  __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00, c30 = c00, c31 = c00,
         c40 = c00, c41 = c00, c50 = c00, c51 = c00;
  const float* wc = w + j0;
  for (int64_t c = 0; c < cin; ++c, wc += cout) {
    const __m256 b0 = _mm256_loadu_ps(wc), b1 = _mm256_loadu_ps(wc + 8);
    __m256 a = _mm256_broadcast_ss(x0 + c);
    c00 = _mm256_fmadd_ps(a, b0, c00);
    c01 = _mm256_fmadd_ps(a, b1, c01);
    a = _mm256_broadcast_ss(x1 + c);
    c10 = _mm256_fmadd_ps(a, b0, c10);
    c11 = _mm256_fmadd_ps(a, b1, c11);
    a = _mm256_broadcast_ss(x2 + c);
    c20 = _mm256_fmadd_ps(a, b0, c20);
    c21 = _mm256_fmadd_ps(a, b1, c21);
    a = _mm256_broadcast_ss(x3 + c);
    c30 = _mm256_fmadd_ps(a, b0, c30);
    c31 = _mm256_fmadd_ps(a, b1, c31);
    a = _mm256_broadcast_ss(x4 + c);
    c40 = _mm256_fmadd_ps(a, b0, c40);
    c41 = _mm256_fmadd_ps(a, b1, c41);
    a = _mm256_broadcast_ss(x5 + c);
    c50 = _mm256_fmadd_ps(a, b0, c50);
    c51 = _mm256_fmadd_ps(a, b1, c51);
  }
  float* yr = y + j0;
  add_row(yr + int64_t{scatter[0]} * cout, c00, c01);
  if (rows > 1) add_row(yr + int64_t{scatter[1]} * cout, c10, c11);
  if (rows > 2) add_row(yr + int64_t{scatter[2]} * cout, c20, c21);
  if (rows > 3) add_row(yr + int64_t{scatter[3]} * cout, c30, c31);
  if (rows > 4) add_row(yr + int64_t{scatter[4]} * cout, c40, c41);
  if (rows > 5) add_row(yr + int64_t{scatter[5]} * cout, c50, c51);
}

// The same for channels [j0, j0 + 8) (the last 8 of a cout that is not a multiple of 16).
SPCONV_TARGET_AVX2 inline void tile8(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                     int64_t rows, const float* w, int64_t cout, int64_t j0, float* y) {
  const float* xr[kRows];
  for (int i = 0; i < kRows; ++i) xr[i] = x + static_cast<int64_t>(gather[i < rows ? i : 0]) * cin;
  __m256 acc[kRows];
  for (int i = 0; i < kRows; ++i) acc[i] = _mm256_setzero_ps();
  const float* wc = w + j0;
  for (int64_t c = 0; c < cin; ++c, wc += cout) {
    const __m256 b = _mm256_loadu_ps(wc);
    for (int i = 0; i < kRows; ++i) acc[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(xr[i] + c), b, acc[i]);
  }
  for (int i = 0; i < rows; ++i) {
    float* yr = y + static_cast<int64_t>(scatter[i]) * cout + j0;
    _mm256_storeu_ps(yr, _mm256_add_ps(_mm256_loadu_ps(yr), acc[i]));
  }
}

using Tile = void (*)(const float*, int64_t, const int32_t*, const int32_t*, int64_t, const float*, int64_t, int64_t,
                      float*);

// The first column pass prefetches the next tile's rows (gathered rows of a real scan miss the cache); later
// passes find the rows in L1/L2.
template <Tile T>
SPCONV_TARGET_AVX2 void columns(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                int64_t m, const float* w, int64_t cout, int64_t j0, float* y) {
  const bool prefetch = j0 == 0;
  for (int64_t p = 0; p < m; p += kRows) {
    if (prefetch && p + kRows < m)
      prefetch_rows(x, cin, gather + p + kRows, std::min<int64_t>(kRows, m - p - kRows));
    T(x, cin, gather + p, scatter + p, std::min<int64_t>(kRows, m - p), w, cout, j0, y);
  }
}

// ---- the filter gradient ----

// dw rows [c0, c0 + R) x columns [j0, j0 + 8 * NV) += sum over pairs [0, m) of x[in[p], c] * dy[out[p], j],
// pairs in order, continuing each element's chain from its stored value (or from zero when `fresh`): the
// AVX-512 kernel's chains, so both give the same bits. R x NV accumulators (up to 6 x 2), NV dy vectors, 1
// broadcast; R a constant as in the AVX-512 tile.
template <int NV, int R>
SPCONV_TARGET_AVX2 void dw_tile(const float* x, int64_t ldx, const float* dy, int64_t ldy, int64_t cout,
                                const int32_t* in, const int32_t* out, int64_t m, int64_t c0, int64_t j0, bool fresh,
                                float* dw) {
  __m256 acc[R][NV];
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v)
      acc[i][v] = fresh ? _mm256_setzero_ps() : _mm256_loadu_ps(dw + (c0 + i) * cout + j0 + 8 * v);
  const float* xc = x + c0;
  const float* gc = dy + j0;
  for (int64_t p = 0; p < m; ++p) {
    const float* xr = xc + int64_t{in[p]} * ldx;
    const float* gr = gc + int64_t{out[p]} * ldy;
    __m256 b[NV];
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) b[v] = _mm256_loadu_ps(gr + 8 * v);
#pragma GCC unroll 6
    for (int i = 0; i < R; ++i) {
      const __m256 a = _mm256_broadcast_ss(xr + i);
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
#pragma GCC unroll 6
  for (int i = 0; i < R; ++i)
#pragma GCC unroll 2
    for (int v = 0; v < NV; ++v) _mm256_storeu_ps(dw + (c0 + i) * cout + j0 + 8 * v, acc[i][v]);
}

using DwTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const int32_t*, const int32_t*, int64_t,
                        int64_t, int64_t, bool, float*);
// [R - 1]: the tiles of R channels and two vectors, and of one vector.
constexpr DwTile kDwTiles2[] = {dw_tile<2, 1>, dw_tile<2, 2>, dw_tile<2, 3>,
                                dw_tile<2, 4>, dw_tile<2, 5>, dw_tile<2, 6>};
constexpr DwTile kDwTiles1[] = {dw_tile<1, 1>, dw_tile<1, 2>, dw_tile<1, 3>,
                                dw_tile<1, 4>, dw_tile<1, 5>, dw_tile<1, 6>};

}  // namespace

void fused_weight_grad_avx2(const float* x, int64_t ldx, int64_t cin, const float* dy, int64_t ldy, int64_t cout,
                            const int32_t* in, const int32_t* out, int64_t m, bool accumulate, float* dw) {
  auto tile = [&](int64_t p0, int64_t n, int64_t c0, int64_t rows, bool fresh) {
    int64_t j0 = 0;
    for (; j0 + 16 <= cout; j0 += 16)
      kDwTiles2[rows - 1](x, ldx, dy, ldy, cout, in + p0, out + p0, n, c0, j0, fresh, dw);
    if (cout - j0 >= 8) kDwTiles1[rows - 1](x, ldx, dy, ldy, cout, in + p0, out + p0, n, c0, j0, fresh, dw);
  };
  const WeightGradAhead<float> ahead{x, ldx, cin, dy, ldy, cout, in, out};
  weight_grad_loop(cin, cout, m, accumulate, kRows, dw, tile, ahead);
}

void fused_gather_gemm_scatter_avx2(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                    int64_t m, const float* w, int64_t cout, float* y) {
  // 16 channels per pass, then 8; the filter slice of a pass (cin x 16) stays in L1 over all the tiles.
  int64_t j0 = 0;
  for (; j0 + 16 <= cout; j0 += 16) columns<tile16>(x, cin, gather, scatter, m, w, cout, j0, y);
  if (cout - j0 >= 8) columns<tile8>(x, cin, gather, scatter, m, w, cout, j0, y);
}
#else
void fused_gather_gemm_scatter_avx2(const float*, int64_t, const int32_t*, const int32_t*, int64_t, const float*,
                                    int64_t, float*) {}
void fused_weight_grad_avx2(const float*, int64_t, int64_t, const float*, int64_t, int64_t, const int32_t*,
                            const int32_t*, int64_t, bool, float*) {}
#endif

}  // namespace native
}  // namespace spconv
