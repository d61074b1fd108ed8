#include "fused_gemm.h"

#include <algorithm>

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

#if SPCONV_HAVE_AVX2_PATH
namespace {

#define SPCONV_TARGET_AVX512F __attribute__((target("avx512f,avx2,fma")))

// 6 register rows (pairs in the forward, input channels in dW) x 4 vectors = 24 accumulators, plus 4 operand
// vectors: 28 of the 32 registers.
constexpr int kRows = 6;

// One tile: `rows` pairs starting at p, output channels [j0, j0 + 16 * NV).
template <int NV>
SPCONV_TARGET_AVX512F inline void tile(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                       int64_t rows, const float* w, int64_t cout, int64_t j0, float* y) {
  const float* xr[kRows];
  for (int i = 0; i < kRows; ++i) xr[i] = x + static_cast<int64_t>(gather[i < rows ? i : 0]) * cin;
  __m512 acc[kRows][NV];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_setzero_ps();
  const float* wc = w + j0;
  for (int64_t c = 0; c < cin; ++c, wc += cout) {
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(wc + 16 * v);
    for (int i = 0; i < kRows; ++i) {
      const __m512 a = _mm512_set1_ps(xr[i][c]);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < rows; ++i) {
    float* yr = y + static_cast<int64_t>(scatter[i]) * cout + j0;
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(yr + 16 * v, _mm512_add_ps(_mm512_loadu_ps(yr + 16 * v), acc[i][v]));
  }
}

template <int NV>
SPCONV_TARGET_AVX512F void columns(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                   int64_t m, const float* w, int64_t cout, int64_t j0, float* y) {
  for (int64_t p = 0; p < m; p += kRows)
    tile<NV>(x, cin, gather + p, scatter + p, std::min<int64_t>(kRows, m - p), w, cout, j0, y);
}

// ---- the filter gradient ----
constexpr int64_t kChunk = 256;  // pairs per dW pass: their x and dy rows stay in L2 over all the tiles

// dw rows [c0, c0 + rows) x columns [j0, j0 + 16 * NV) += sum over pairs [0, m) of x[in[p], c] * dy[out[p], j],
// pairs in order, continuing each element's chain from its stored value (or from zero when `fresh`).
template <int NV>
SPCONV_TARGET_AVX512F void dw_tile(const float* x, int64_t cin, const float* dy, int64_t cout, const int32_t* in,
                                   const int32_t* out, int64_t m, int64_t c0, int64_t rows, int64_t j0, bool fresh,
                                   float* dw) {
  int64_t col[kRows];  // the channel each register row reads (the rows past `rows` repeat the first)
  for (int i = 0; i < kRows; ++i) col[i] = c0 + (i < rows ? i : 0);
  __m512 acc[kRows][NV];
  for (int i = 0; i < kRows; ++i)
    for (int v = 0; v < NV; ++v)
      acc[i][v] = fresh || i >= rows ? _mm512_setzero_ps() : _mm512_loadu_ps(dw + col[i] * cout + j0 + 16 * v);
  for (int64_t p = 0; p < m; ++p) {
    const float* xr = x + int64_t{in[p]} * cin;
    const float* gr = dy + int64_t{out[p]} * cout + j0;
    __m512 b[NV];
    for (int v = 0; v < NV; ++v) b[v] = _mm512_loadu_ps(gr + 16 * v);
    for (int i = 0; i < kRows; ++i) {
      const __m512 a = _mm512_set1_ps(xr[col[i]]);
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm512_fmadd_ps(a, b[v], acc[i][v]);
    }
  }
  for (int i = 0; i < kRows; ++i) {
    if (i >= rows) break;
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(dw + (c0 + i) * cout + j0 + 16 * v, acc[i][v]);
  }
}

using DwTile = void (*)(const float*, int64_t, const float*, int64_t, const int32_t*, const int32_t*, int64_t,
                        int64_t, int64_t, int64_t, bool, float*);
constexpr DwTile kDwTiles[] = {dw_tile<1>, dw_tile<2>, dw_tile<3>, dw_tile<4>};

}  // namespace

void fused_gather_gemm_scatter_avx512(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const float* w, int64_t cout, float* y) {
  // 64 channels per pass; the rest in a narrower pass. The gathered rows of a pass stay in L1 for the next.
  int64_t j0 = 0;
  for (; j0 + 64 <= cout; j0 += 64) columns<4>(x, cin, gather, scatter, m, w, cout, j0, y);
  switch ((cout - j0) / 16) {
    case 3: columns<3>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    case 2: columns<2>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    case 1: columns<1>(x, cin, gather, scatter, m, w, cout, j0, y); break;
    default: break;
  }
}
void fused_weight_grad_avx512(const float* x, int64_t cin, const float* dy, int64_t cout, const int32_t* in,
                              const int32_t* out, int64_t m, bool accumulate, float* dw) {
  if (m == 0) {
    if (!accumulate) std::fill(dw, dw + cin * cout, 0.f);
    return;
  }
  for (int64_t p0 = 0; p0 < m; p0 += kChunk) {
    const int64_t n = std::min(kChunk, m - p0);
    const bool fresh = p0 == 0 && !accumulate;
    for (int64_t c0 = 0; c0 < cin; c0 += kRows) {
      const int64_t rows = std::min<int64_t>(kRows, cin - c0);
      for (int64_t j0 = 0; j0 < cout; j0 += 64) {
        const int64_t nv = std::min<int64_t>(64, cout - j0) / 16;
        kDwTiles[nv - 1](x, cin, dy, cout, in + p0, out + p0, n, c0, rows, j0, fresh, dw);
      }
    }
  }
}
#else
void fused_gather_gemm_scatter_avx512(const float*, int64_t, const int32_t*, const int32_t*, int64_t, const float*,
                                      int64_t, float*) {}
void fused_weight_grad_avx512(const float*, int64_t, const float*, int64_t, const int32_t*, const int32_t*, int64_t,
                              bool, float*) {}
#endif

}  // namespace native
}  // namespace spconv
