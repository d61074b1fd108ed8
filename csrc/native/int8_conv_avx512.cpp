// The AVX-512 VNNI body of the int8 convolution. vpdpbusd multiplies unsigned by signed bytes, four per int32
// lane, without intermediate saturation: the weights become the unsigned operand (w + 128, packed per offset
// as [cin/4][cout][4], so lane c of a vector holds w[i..i+3, c]) and each input row broadcasts its signed
// bytes x[i..i+3]. The sum then carries 128 * sum_i x[i] per present input row, subtracted before the
// epilogue. Lanes wrap modulo 2^32, and the true sum fits in int32 (the glue bounds the products), so the
// difference is exact even where the biased sum overflows.
#include "int8_conv.h"

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
// GCC 12's AVX-512 intrinsics start some results from a self-initialised "undefined" vector, which
// -Wmaybe-uninitialized reports once they are inlined here (a false positive, GCC bug 105593).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include <cstring>

#include "int8_conv_common.h"
#include "lane_masks.h"

namespace spconv {
namespace native {

namespace {
using namespace int8;

#define SPCONV_TARGET_VNNI __attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,avx2,fma")))

constexpr int kLanes = 16;
// Rows per register tile for NV vectors of 16 output channels: rows x NV accumulators, NV weight vectors and
// a broadcast fit the 32 registers.
constexpr int max_rows(int nv) { return nv == 4 ? 6 : nv == 3 ? 8 : nv == 2 ? 12 : 16; }

// Weights as described above: [kvol][groups][cout_p][4] bytes, zero past cin (the input's padding is zero
// too) and past cout.
struct PackedWeights {
  int64_t groups, cout_p;
  Aligned<uint8_t> w;
  explicit PackedWeights(const Int8Conv& a)
      : groups((a.cin + 3) / 4), cout_p(round_up(a.cout, kLanes)), w(a.kvol * groups * cout_p * 4) {
    uint8_t* p = w.get();
    for (int64_t k = 0; k < a.kvol; ++k)
      for (int64_t i = 0; i < a.cin; ++i) {
        const int8_t* src = a.w + (k * a.cin + i) * a.cout;
        uint8_t* dst = p + ((k * groups + i / 4) * cout_p) * 4 + i % 4;
        for (int64_t c = 0; c < a.cout; ++c) dst[c * 4] = static_cast<uint8_t>(src[c] + 128);
      }
  }
  const uint8_t* offset(int64_t k) const { return w.get() + k * groups * cout_p * 4; }
};

// The tiles' vector: a parameter, so that a 256-bit variant can be tried.
struct Zmm {
  using V = __m512i;
  static constexpr int lanes = 16;
  SPCONV_TARGET_VNNI static V load(const void* p) { return _mm512_load_si512(p); }
  SPCONV_TARGET_VNNI static void store(void* p, V v) { _mm512_store_si512(p, v); }
  SPCONV_TARGET_VNNI static V dp(V s, V w, int32_t x) { return _mm512_dpbusd_epi32(s, w, _mm512_set1_epi32(x)); }
};

// rows x (lanes * NV) outputs: acc rows row[0..R) at channel c0 (acc and w already offset), summed over all
// groups. Shaped for GCC's register allocator: flat accumulators and the broadcast written inside the row loop
// (it still loads each once per group); with [R][NV] arrays and the broadcast hoisted per row it stored the
// accumulators to the stack every group.
template <class Vec, int NV, int R>
SPCONV_TARGET_VNNI void tile(const int8_t* const* xr, const int32_t* row, const uint8_t* w, int64_t groups,
                             int64_t wstride, int32_t* acc, int64_t astride) {
  constexpr int L = Vec::lanes;
  int32_t* dst[R];
  const int8_t* x[R];
  for (int r = 0; r < R; ++r) dst[r] = acc + row[r] * astride, x[r] = xr[r];
  typename Vec::V s[R * NV];
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) s[r * NV + v] = Vec::load(dst[r] + L * v);
  for (int64_t g = 0; g < groups; ++g, w += wstride) {
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) {
      const typename Vec::V b = Vec::load(w + 4 * L * v);
#pragma GCC unroll 64
      for (int r = 0; r < R; ++r) {
        int32_t q;
        std::memcpy(&q, x[r] + 4 * g, 4);
        s[r * NV + v] = Vec::dp(s[r * NV + v], b, q);
      }
    }
  }
#pragma GCC unroll 64
  for (int r = 0; r < R; ++r)
#pragma GCC unroll 64
    for (int v = 0; v < NV; ++v) Vec::store(dst[r] + L * v, s[r * NV + v]);
}

// The last n < max_rows(NV) rows of a column, in one tile of exactly n rows.
template <class Vec, int NV, int R>
SPCONV_TARGET_VNNI void tail(int n, const int8_t* const* xr, const int32_t* row, const uint8_t* w, int64_t groups,
                             int64_t wstride, int32_t* acc, int64_t astride) {
  if constexpr (R >= 1) {
    if (n == R) tile<Vec, NV, R>(xr, row, w, groups, wstride, acc, astride);
    else tail<Vec, NV, R - 1>(n, xr, row, w, groups, wstride, acc, astride);
  }
}

// The n present rows of one column (their input rows at xr).
template <class Vec, int NV>
SPCONV_TARGET_VNNI void column(int n, const int8_t* const* xr, const int32_t* row, const uint8_t* w, int64_t groups,
                               int64_t wstride, int32_t* acc, int64_t astride) {
  constexpr int R = max_rows(NV);
  int p = 0;
  for (; p + R <= n; p += R) tile<Vec, NV, R>(xr + p, row + p, w, groups, wstride, acc, astride);
  tail<Vec, NV, R - 1>(n - p, xr + p, row + p, w, groups, wstride, acc, astride);
}

// One column's products over all output channels, in passes of up to 4 vectors.
template <class Vec>
SPCONV_TARGET_VNNI void column_all(int n, const int8_t* const* xr, const int32_t* row, const uint8_t* wk,
                                   int64_t groups, int64_t cout_p, int32_t* acc) {
  constexpr int L = Vec::lanes;
  for (int64_t c0 = 0; c0 < cout_p; c0 += 4 * L) {
    const uint8_t* w = wk + c0 * 4;
    int32_t* s = acc + c0;
    switch (std::min<int64_t>(4, (cout_p - c0) / L)) {
      case 4: column<Vec, 4>(n, xr, row, w, groups, cout_p * 4, s, cout_p); break;
      case 3: column<Vec, 3>(n, xr, row, w, groups, cout_p * 4, s, cout_p); break;
      case 2: column<Vec, 2>(n, xr, row, w, groups, cout_p * 4, s, cout_p); break;
      default: column<Vec, 1>(n, xr, row, w, groups, cout_p * 4, s, cout_p); break;
    }
  }
}

// A rounded product that no later add contracts into an FMA (as rounded() in int8_conv_common.h).
SPCONV_TARGET_VNNI inline __m512 keep(__m512 v) {
  asm("" : "+v"(v));
  return v;
}

// Output row o from its biased sums s (cout_p lanes) and byte-sum correction.
SPCONV_TARGET_VNNI void epilogue_row(const Int8Conv& a, int64_t o, const int32_t* s, int32_t corr) {
  const __m512i bias128 = _mm512_set1_epi32(static_cast<int32_t>(static_cast<uint32_t>(corr) * 128u));
  const __m512 rs = _mm512_set1_ps(a.residual_scale), alpha = _mm512_set1_ps(a.alpha), zero = _mm512_setzero_ps();
  const __m512 lo = _mm512_set1_ps(-128.f), hi = _mm512_set1_ps(127.f);
  int8_t* dst = a.out + o * a.cout;
  for (int64_t c = 0; c < a.cout; c += kLanes) {
    const __mmask16 m = lanes16(a.cout - c);
    const __m512i acc = _mm512_sub_epi32(_mm512_load_si512(s + c), bias128);
    __m512 v = keep(_mm512_mul_ps(_mm512_cvtepi32_ps(acc), _mm512_maskz_loadu_ps(m, a.scale + c)));
    if (a.bias) v = _mm512_add_ps(v, _mm512_maskz_loadu_ps(m, a.bias + c));
    if (a.residual) {
      const __m512i r = _mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(m, a.residual + o * a.cout + c));
      v = _mm512_add_ps(v, keep(_mm512_mul_ps(_mm512_cvtepi32_ps(r), rs)));
    }
    if (a.activation == 1) {
      v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), zero);
    } else if (a.activation == 2) {
      v = _mm512_mask_mov_ps(v, _mm512_cmp_ps_mask(v, zero, _CMP_LT_OQ), keep(_mm512_mul_ps(v, alpha)));
    }
    const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    v = _mm512_roundscale_ps(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);
    v = _mm512_mask_mov_ps(v, nan, zero);
    // narrowed in a register: the memory form of vpmovsdb is slow on some cores
    _mm_mask_storeu_epi8(dst + c, m, _mm512_cvtsepi32_epi8(_mm512_cvtps_epi32(v)));
  }
}

// The present entries of a block's rows in table columns [j0, j0 + cols), cols <= 32, listed by column
// (output row in the block, input row address), and the byte sums of their input rows added to corr (dot
// products with ones, while the row is read anyway: no separate pass over the inputs, and the row is in L1 when
// its tile reads it). One pass over the rows, visiting only the present entries (about a quarter of a SubM
// table); returns whether an entry lies outside [-1, num_in).
constexpr int kListColumns = 32;
struct BlockLists {
  int n[kListColumns];
  int32_t row[kListColumns][kBlockRows];
  const int8_t* x[kListColumns][kBlockRows];
};

SPCONV_TARGET_VNNI bool block_lists(const Int8Conv& a, int64_t o0, int64_t rows, int64_t j0, int cols,
                                    const int8_t* x, int64_t stride, int32_t* corr, BlockLists& l) {
  const __mmask16 m0 = lanes16(cols), m1 = lanes16(cols - 16);
  // Entries are int32: with 2^31 inputs or more, every non-negative one is a row.
  const uint32_t rows_in = static_cast<uint32_t>(std::min<int64_t>(a.num_in, int64_t(1) << 31));
  const __m512i num_in = _mm512_set1_epi32(static_cast<int32_t>(rows_in)), none = _mm512_set1_epi32(-1);
  const __m512i ones = _mm512_set1_epi8(1);
  const int64_t last = stride <= 64 ? 0 : (stride - 1) / 64 * 64;  // the row's last 64-byte chunk
  const __mmask64 tail = stride - last >= 64 ? ~__mmask64(0) : (__mmask64(1) << (stride - last)) - 1;
  std::fill_n(l.n, cols, 0);
  __mmask16 bad = 0;
  for (int64_t r = 0; r < rows; ++r) {
    const int32_t* t = a.nbr + (o0 + r) * a.cols + j0;
    const __m512i v0 = _mm512_maskz_loadu_epi32(m0, t), v1 = _mm512_maskz_loadu_epi32(m1, t + 16);
    const __mmask16 p0 = _mm512_mask_cmplt_epu32_mask(m0, v0, num_in);  // 0 <= entry < num_in
    const __mmask16 p1 = _mm512_mask_cmplt_epu32_mask(m1, v1, num_in);
    bad |= _mm512_mask_cmpneq_epi32_mask(m0 & ~p0, v0, none) | _mm512_mask_cmpneq_epi32_mask(m1 & ~p1, v1, none);
    __m512i sum = _mm512_setzero_si512();
    for (uint32_t bits = uint32_t(p0) | (uint32_t(p1) << 16); bits != 0; bits &= bits - 1) {
      const int j = __builtin_ctz(bits);
      const int8_t* xi = x + static_cast<int64_t>(t[j]) * stride;
      const int k = l.n[j]++;
      l.row[j][k] = static_cast<int32_t>(r);
      l.x[j][k] = xi;
      for (int64_t c = 0; c < last; c += 64) sum = _mm512_dpbusd_epi32(sum, ones, _mm512_loadu_si512(xi + c));
      sum = _mm512_dpbusd_epi32(sum, ones, _mm512_maskz_loadu_epi8(tail, xi + last));
    }
    corr[r] += _mm512_reduce_add_epi32(sum);
  }
  return bad != 0;
}
}  // namespace

bool int8_conv_avx512_vnni(const Int8Conv& a) {
  const PackedWeights pw(a);
  const int64_t groups = pw.groups, cout_p = pw.cout_p, stride = groups * 4;
  // Inputs whose rows aren't whole groups of 4 bytes get a zero-padded copy.
  std::unique_ptr<Aligned<int8_t>> padded;
  if (stride != a.cin) padded = std::make_unique<Aligned<int8_t>>(a.num_in * stride);
  const int8_t* x = padded ? padded->get() : a.x;
  if (padded)
    at::parallel_for(0, a.num_in, 16384, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) std::memcpy(padded->get() + i * stride, a.x + i * a.cin, a.cin);
    });
  return for_each_block(a, [&] {
    return [&, acc = Aligned<int32_t>(kBlockRows * cout_p), corr = Aligned<int32_t>(kBlockRows),
            lists = std::make_unique<BlockLists>()](int64_t b, bool& bad) {
      const int64_t o0 = b * kBlockRows, rows = std::min(kBlockRows, a.num_out - o0);
      std::fill_n(acc.get(), rows * cout_p, 0);
      std::fill_n(corr.get(), rows, 0);
      BlockLists& l = *lists;
      for (int64_t j0 = 0; j0 < a.cols; j0 += kListColumns) {
        const int cols = static_cast<int>(std::min<int64_t>(kListColumns, a.cols - j0));
        bad |= block_lists(a, o0, rows, j0, cols, x, stride, corr.get(), l);
        for (int c = 0; c < cols; ++c)
          if (l.n[c] > 0)
            column_all<Zmm>(l.n[c], l.x[c], l.row[c], pw.offset((j0 + c) % a.kvol), groups, cout_p, acc.get());
      }
      for (int64_t r = 0; r < rows; ++r) epilogue_row(a, o0 + r, acc.get() + r * cout_p, corr.get()[r]);
    };
  });
}

}  // namespace native
}  // namespace spconv
#endif
