// The AVX2 body of the int8 convolution: inputs and weights sign-extended to int16 pairs, vpmaddwd sums each
// pair exactly into an int32 lane (|x * w| <= 2^14, so the pair sum never saturates; vpmaddubsw would).
// Weights packed per offset as [cin/2][cout][2] int16, so lane c of a vector holds w[i, c], w[i+1, c].
#include "int8_conv.h"

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>

#include <cstring>

#include "int8_conv_common.h"

namespace spconv {
namespace native {

namespace {
using namespace int8;

constexpr int kLanes = 8;
// Rows per register tile for NV vectors of 8 output channels (16 registers).
constexpr int max_rows(int nv) { return nv == 4 ? 3 : nv == 3 ? 4 : nv == 2 ? 6 : 8; }

struct PackedWeights {
  int64_t pairs, cout_p;
  Aligned<int16_t> w;
  explicit PackedWeights(const Int8Conv& a)
      : pairs((a.cin + 1) / 2), cout_p(round_up(a.cout, kLanes)), w(a.kvol * pairs * cout_p * 2) {
    int16_t* p = w.get();
    for (int64_t k = 0; k < a.kvol; ++k)
      for (int64_t i = 0; i < a.cin; ++i) {
        const int8_t* src = a.w + (k * a.cin + i) * a.cout;
        int16_t* dst = p + ((k * pairs + i / 2) * cout_p) * 2 + i % 2;
        for (int64_t c = 0; c < a.cout; ++c) dst[c * 2] = src[c];
      }
  }
  const int16_t* offset(int64_t k) const { return w.get() + k * pairs * cout_p * 2; }
};

// As the AVX-512 body's tile (int8_conv_avx512.cpp), with the same shape for the register allocator.
template <int NV, int R>
SPCONV_TARGET_AVX2 void tile(const int16_t* const* xr, const int32_t* row, const int16_t* w, int64_t pairs,
                             int64_t wstride, int32_t* acc, int64_t astride) {
  __m256i* dst[R];
  const int16_t* x[R];
  for (int r = 0; r < R; ++r) dst[r] = reinterpret_cast<__m256i*>(acc + row[r] * astride), x[r] = xr[r];
  __m256i s[R * NV];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) s[r * NV + v] = _mm256_load_si256(dst[r] + v);
  for (int64_t g = 0; g < pairs; ++g, w += wstride) {
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) {
      const __m256i b = _mm256_load_si256(reinterpret_cast<const __m256i*>(w + 16 * v));
#pragma GCC unroll 64
      for (int r = 0; r < R; ++r) {
        int32_t q;
        std::memcpy(&q, x[r] + 2 * g, 4);
        s[r * NV + v] = _mm256_add_epi32(s[r * NV + v], _mm256_madd_epi16(b, _mm256_set1_epi32(q)));
      }
    }
  }
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) _mm256_store_si256(dst[r] + v, s[r * NV + v]);
}

template <int NV, int R>
SPCONV_TARGET_AVX2 void tail(int n, const int16_t* const* xr, const int32_t* row, const int16_t* w, int64_t pairs,
                             int64_t wstride, int32_t* acc, int64_t astride) {
  if constexpr (R >= 1) {
    if (n == R) tile<NV, R>(xr, row, w, pairs, wstride, acc, astride);
    else tail<NV, R - 1>(n, xr, row, w, pairs, wstride, acc, astride);
  }
}

// The present rows of one column (their int16 input rows in xr).
template <int NV>
SPCONV_TARGET_AVX2 void column(int n, const int16_t* const* xr, const int32_t* row, const int16_t* w,
                               int64_t pairs, int64_t wstride, int32_t* acc, int64_t astride) {
  constexpr int R = max_rows(NV);
  int p = 0;
  for (; p + R <= n; p += R) tile<NV, R>(xr + p, row + p, w, pairs, wstride, acc, astride);
  tail<NV, R - 1>(n - p, xr + p, row + p, w, pairs, wstride, acc, astride);
}

// A rounded product that no later add contracts into an FMA (as rounded() in int8_conv_common.h).
SPCONV_TARGET_AVX2 inline __m256 keep(__m256 v) {
  asm("" : "+v"(v));
  return v;
}

// Full vectors of 8 channels; the channels past the last full vector take the scalar epilogue.
SPCONV_TARGET_AVX2 void epilogue_row(const Int8Conv& a, int64_t o, const int32_t* s) {
  const __m256 rs = _mm256_set1_ps(a.residual_scale), alpha = _mm256_set1_ps(a.alpha);
  const __m256 zero = _mm256_setzero_ps(), lo = _mm256_set1_ps(-128.f), hi = _mm256_set1_ps(127.f);
  int8_t* dst = a.out + o * a.cout;
  int64_t c = 0;
  for (; c + kLanes <= a.cout; c += kLanes) {
    const __m256i acc = _mm256_load_si256(reinterpret_cast<const __m256i*>(s + c));
    __m256 v = keep(_mm256_mul_ps(_mm256_cvtepi32_ps(acc), _mm256_loadu_ps(a.scale + c)));
    if (a.bias) v = _mm256_add_ps(v, _mm256_loadu_ps(a.bias + c));
    if (a.residual) {
      int64_t q;
      std::memcpy(&q, a.residual + o * a.cout + c, 8);
      const __m256i r = _mm256_cvtepi8_epi32(_mm_cvtsi64_si128(q));
      v = _mm256_add_ps(v, keep(_mm256_mul_ps(_mm256_cvtepi32_ps(r), rs)));
    }
    if (a.activation == 1) {
      v = _mm256_blendv_ps(v, zero, _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    } else if (a.activation == 2) {
      v = _mm256_blendv_ps(v, keep(_mm256_mul_ps(v, alpha)), _mm256_cmp_ps(v, zero, _CMP_LT_OQ));
    }
    const __m256 ordered = _mm256_cmp_ps(v, v, _CMP_ORD_Q);
    v = _mm256_round_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm256_and_ps(_mm256_min_ps(_mm256_max_ps(v, lo), hi), ordered);  // NaN lanes to +0
    alignas(32) int32_t q[kLanes];
    _mm256_store_si256(reinterpret_cast<__m256i*>(q), _mm256_cvtps_epi32(v));
    for (int l = 0; l < kLanes; ++l) dst[c + l] = static_cast<int8_t>(q[l]);
  }
  for (; c < a.cout; ++c) dst[c] = requantize(a, o, c, s[c]);
}
}  // namespace

bool int8_conv_avx2(const Int8Conv& a) {
  const PackedWeights pw(a);
  const int64_t pairs = pw.pairs, cout_p = pw.cout_p, stride = pairs * 2;
  // The inputs as int16, rows padded to whole pairs with zeros.
  Aligned<int16_t> x16(a.num_in * stride);
  at::parallel_for(0, a.num_in, 16384, [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i)
      for (int64_t c = 0; c < a.cin; ++c) x16.get()[i * stride + c] = a.x[i * a.cin + c];
  });
  return for_each_block(a, [&] {
    return [&, acc = Aligned<int32_t>(kBlockRows * cout_p), col = std::make_unique<BlockColumn>(),
            xr = std::make_unique<const int16_t*[]>(kBlockRows)](int64_t b, bool& bad) {
      const int64_t o0 = b * kBlockRows, rows = std::min(kBlockRows, a.num_out - o0);
      std::fill_n(acc.get(), rows * cout_p, 0);
      for (int64_t j = 0; j < a.cols; ++j) {
        gather_column(a, o0, rows, j, nullptr, nullptr, *col, bad);
        if (col->n == 0) continue;
        for (int p = 0; p < col->n; ++p) xr[p] = x16.get() + static_cast<int64_t>(col->in[p]) * stride;
        const int16_t* wk = pw.offset(j % a.kvol);
        for (int64_t c0 = 0; c0 < cout_p; c0 += 4 * kLanes) {
          const int16_t* w = wk + c0 * 2;
          int32_t* s = acc.get() + c0;
          switch (std::min<int64_t>(4, (cout_p - c0) / kLanes)) {
            case 4: column<4>(col->n, xr.get(), col->row, w, pairs, cout_p * 2, s, cout_p); break;
            case 3: column<3>(col->n, xr.get(), col->row, w, pairs, cout_p * 2, s, cout_p); break;
            case 2: column<2>(col->n, xr.get(), col->row, w, pairs, cout_p * 2, s, cout_p); break;
            default: column<1>(col->n, xr.get(), col->row, w, pairs, cout_p * 2, s, cout_p); break;
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) epilogue_row(a, o0 + r, acc.get() + r * cout_p);
    };
  });
}

}  // namespace native
}  // namespace spconv
#endif
