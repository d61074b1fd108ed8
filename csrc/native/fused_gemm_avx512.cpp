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

constexpr int kRows = 6;  // 6 rows x 4 vectors = 24 accumulators, 4 filter vectors: 28 of 32 registers

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
#else
void fused_gather_gemm_scatter_avx512(const float*, int64_t, const int32_t*, const int32_t*, int64_t, const float*,
                                      int64_t, float*) {}
#endif

}  // namespace native
}  // namespace spconv
