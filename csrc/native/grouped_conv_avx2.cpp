// The AVX2/FMA bodies of the grouped convolution (grouped_conv.h) for float: the table compaction, the row
// loops (depthwise and grouped forward, depthwise backward) and the bucketed forward's tiles. Whole-vector loads,
// the last vector of a row masked. Each output element is the same chain of FMAs in pair order as on the
// AVX-512 path: the same bits.
#include "grouped_conv_rows.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>

#include <array>
#include <utility>

#include "lane_masks.h"

namespace spconv {
namespace native {
namespace grouped {

namespace {

// Output columns accumulated in registers at a time (8 AVX vectors).
constexpr int64_t kColTile = 64;

// For each 8-bit mask, the lanes it selects in ascending order, packed to the front (one byte per lane).
constexpr std::array<uint64_t, 256> compress_lanes8() {
  std::array<uint64_t, 256> t{};
  for (int m = 0; m < 256; ++m) {
    int n = 0;
    for (int lane = 0; lane < 8; ++lane)
      if (m >> lane & 1) t[m] |= static_cast<uint64_t>(lane) << (8 * n++);
  }
  return t;
}
constexpr std::array<uint64_t, 256> kCompressLanes8 = compress_lanes8();

}  // namespace

// compact_rows_avx512 with 8 entries per step: AVX2 has no compress, so a lane permutation looked up by the
// valid mask packs them.
SPCONV_TARGET_AVX2 bool compact_rows_avx2(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c) {
  const int64_t kvol = s.kvol;
  // Unsigned compare against n_other through a sign flip: -1 and other negatives land above any row count.
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);
  const __m256i limit = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int32_t>(s.n_other)), flip);
  const __m256i none = _mm256_set1_epi32(-1);
  const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  int bad = 0;
  int64_t n = 0;
  for (int64_t r = r0; r < r1; ++r) {
    c.start[r - r0] = n;
    const int32_t* t = s.table + r * kvol;
    for (int64_t j0 = 0; j0 < kvol; j0 += 8) {
      const __m256i in = tail_mask(kvol - j0);
      const __m256i v = kvol - j0 >= 8 ? _mm256_loadu_si256(reinterpret_cast<const __m256i*>(t + j0))
                                       : _mm256_maskload_epi32(t + j0, in);
      const __m256i ok = _mm256_and_si256(in, _mm256_cmpgt_epi32(limit, _mm256_xor_si256(v, flip)));
      const int mask = _mm256_movemask_ps(_mm256_castsi256_ps(ok));
      bad |= _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_andnot_si256(_mm256_cmpeq_epi32(v, none), in))) & ~mask;
      const __m256i perm = _mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(kCompressLanes8[mask])));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.other.data() + n), _mm256_permutevar8x32_epi32(v, perm));
      const __m256i k = _mm256_add_epi32(iota, _mm256_set1_epi32(static_cast<int32_t>(j0)));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(c.offset.data() + n), _mm256_permutevar8x32_epi32(k, perm));
      n += __builtin_popcount(static_cast<unsigned>(mask));
    }
  }
  c.start[r1 - r0] = n;
  return bad == 0;
}

namespace {

SPCONV_TARGET_AVX2 inline __m256 load_n(const float* p, int64_t lanes) {
  return lanes >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(lanes));
}

SPCONV_TARGET_AVX2 inline void store_n(float* p, __m256 v, int64_t lanes) {
  if (lanes >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, tail_mask(lanes), v);
}

// Depthwise forward, columns [c0, c0 + n) of one row (n <= 8 * NV), over its pairs. Stream: whole, 32-byte
// aligned vectors stored past the cache (see kStreamOutputBytes).
template <int NV, bool Stream = false>
SPCONV_TARGET_AVX2 inline __attribute__((always_inline)) void depthwise_tile(const float* x, const float* w, int64_t C,
                                                                              const PairList& l, int64_t c0,
                                                                              int64_t n, float* yrow) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  if (n == 8 * NV) {  // whole vectors (the common case: no per-vector lane test)
    for (int64_t j = 0; j < l.n; ++j) {
      const float* xo = x + int64_t{l.other[j]} * C + c0;
      const float* wk = w + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(_mm256_loadu_ps(xo + 8 * v), _mm256_loadu_ps(wk + 8 * v), acc[v]);
    }
  } else {
    for (int64_t j = 0; j < l.n; ++j) {
      const float* xo = x + int64_t{l.other[j]} * C + c0;
      const float* wk = w + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm256_fmadd_ps(load_n(xo + 8 * v, n - 8 * v), load_n(wk + 8 * v, n - 8 * v), acc[v]);
    }
  }
  if constexpr (Stream) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_stream_ps(yrow + c0 + 8 * v, acc[v]);
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store_n(yrow + c0 + 8 * v, acc[v], n - 8 * v);
  }
}

// Grouped forward, group g, columns [t0, t0 + 8 * NV) of the group's cog (a multiple of 8), one row.
template <int NV>
SPCONV_TARGET_AVX2 void group_tile(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog,
                                   const PairList& l, int64_t g, int64_t t0, float* yrow) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  const int64_t cin = G * cig;
  for (int64_t j = 0; j < l.n; ++j) {
    const float* xo = x + int64_t{l.other[j]} * cin + g * cig;
    const float* wg = w + ((int64_t{l.offset[j]} * G + g) * cig) * cog + t0;
    for (int64_t c = 0; c < cig; ++c) {
      const __m256 xb = _mm256_broadcast_ss(xo + c);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wg + c * cog + 8 * v), acc[v]);
    }
  }
  float* yg = yrow + g * cog + t0;
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(yg + 8 * v, acc[v]);
}

// A whole row of C % 64 == 0 channels, every tile in one call (a call per tile is a tenth of a depthwise
// row's compute).
template <bool Stream>
SPCONV_TARGET_AVX2 void depthwise_row(const float* x, const float* w, int64_t C, const PairList& l, float* yrow) {
  for (int64_t c0 = 0; c0 < C; c0 += kColTile) depthwise_tile<8, Stream>(x, w, C, l, c0, kColTile, yrow);
}

constexpr DepthwiseTile kDepthwiseTiles[] = {depthwise_tile<1>, depthwise_tile<2>, depthwise_tile<3>,
                                             depthwise_tile<4>, depthwise_tile<5>, depthwise_tile<6>,
                                             depthwise_tile<7>, depthwise_tile<8>};
constexpr GroupTile kGroupTiles[] = {group_tile<1>, group_tile<2>, group_tile<3>, group_tile<4>,
                                     group_tile<5>, group_tile<6>, group_tile<7>, group_tile<8>};

}  // namespace

bool forward_rows_avx2(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, float* y, bool stream) {
  if (cig == 1 && cog == 1) {
    const int64_t C = G;
    // stream: C % 128 == 0 and y 64-byte aligned (grouped_forward checks), so every tile is 64 whole channels.
    const bool ok = walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
      if (C % kColTile == 0) return stream ? depthwise_row<true>(x, w, C, l, y + r * C)
                                           : depthwise_row<false>(x, w, C, l, y + r * C);
      for (int64_t c0 = 0; c0 < C; c0 += kColTile) {
        const int64_t n = std::min(kColTile, C - c0);
        kDepthwiseTiles[(n + 7) / 8 - 1](x, w, C, l, c0, n, y + r * C);
      }
    }, Ahead{x, C});
    if (stream) _mm_sfence();  // the streamed rows are visible before the task ends
    return ok;
  }
  return walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t0 = 0; t0 < cog; t0 += kColTile) {
        const int64_t n = std::min(kColTile, cog - t0);
        kGroupTiles[n / 8 - 1](x, w, G, cig, cog, l, g, t0, y + r * G * cog);
      }
  });
}

namespace {

// One input row's pairs, columns [c0, c0 + n): acc (dx) += dy[o] * w[k], and the dW partial row k += x[i] *
// dy[o], in place. Whole: n == 8 * NV, plain loads and stores (no lane count per vector).
template <int NV, bool Whole>
SPCONV_TARGET_AVX2 inline void depthwise_backward_pairs(const float* w, const float* dy, int64_t C, const PairList& l,
                                                        int64_t c0, int64_t n, const __m256* xi, __m256* acc,
                                                        float* part) {
  for (int64_t j = 0; j < l.n; ++j) {
    const float* d = dy + int64_t{l.other[j]} * C + c0;
    const float* wk = w + int64_t{l.offset[j]} * C + c0;
    float* pk = part + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const int64_t lanes = Whole ? 8 : n - 8 * v;
      const __m256 dv = load_n(d + 8 * v, lanes);
      acc[v] = _mm256_fmadd_ps(dv, load_n(wk + 8 * v, lanes), acc[v]);
      store_n(pk + 8 * v, _mm256_fmadd_ps(xi[v], dv, load_n(pk + 8 * v, lanes)), lanes);
    }
  }
}

// Depthwise backward of one input row i, columns [c0, c0 + n): dx from registers, the dW partial updated in
// place (it stays in L1: kvol x C floats). Stream: as depthwise_tile's.
template <int NV, bool Stream = false>
SPCONV_TARGET_AVX2 void depthwise_backward_tile(const float* x, const float* w, const float* dy, int64_t C,
                                                const PairList& l, int64_t i, int64_t c0, int64_t n, float* dx,
                                                float* part) {
  __m256 acc[NV], xi[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    acc[v] = _mm256_setzero_ps();
    xi[v] = load_n(x + i * C + c0 + 8 * v, n - 8 * v);
  }
  if (n == 8 * NV) depthwise_backward_pairs<NV, true>(w, dy, C, l, c0, n, xi, acc, part);
  else depthwise_backward_pairs<NV, false>(w, dy, C, l, c0, n, xi, acc, part);
  if constexpr (Stream) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm256_stream_ps(dx + i * C + c0 + 8 * v, acc[v]);
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) store_n(dx + i * C + c0 + 8 * v, acc[v], n - 8 * v);
  }
}

constexpr DepthwiseBackwardTile kDepthwiseBackwardTiles[] = {
    depthwise_backward_tile<1>, depthwise_backward_tile<2>, depthwise_backward_tile<3>, depthwise_backward_tile<4>,
    depthwise_backward_tile<5>, depthwise_backward_tile<6>, depthwise_backward_tile<7>, depthwise_backward_tile<8>};

}  // namespace

bool depthwise_backward_rows_avx2(const float* x, const float* w, const float* dy, int64_t C, const GroupedRows& s,
                                  int64_t i0, int64_t i1, float* dx, float* part, bool stream) {
  const bool ok = walk_rows(s, i0, i1, [&](int64_t i, const PairList& l) {
    for (int64_t c0 = 0; c0 < C; c0 += kColTile) {
      const int64_t n = std::min(kColTile, C - c0);
      const DepthwiseBackwardTile tile =
          stream ? depthwise_backward_tile<8, true> : kDepthwiseBackwardTiles[(n + 7) / 8 - 1];
      tile(x, w, dy, C, l, i, c0, n, dx, part);
    }
  }, Ahead{dy, C});
  if (stream) _mm_sfence();  // the streamed rows are visible before the task ends
  return ok;
}

namespace {

// The AVX2 tile: bucket_tile512 with 8-channel vectors, the same chains (bits).
template <int NV, int R>
SPCONV_TARGET_AVX2 void bucket_tile256(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog,
                                       const int32_t* src, const int32_t* dst, int64_t m, const Lookahead& ahead,
                                       int64_t xoff, int64_t yoff, int64_t cout, float* y) {
  for (int64_t p = 0; p < m; p += R) {
    ahead.request(x, cin, src, p + kLookaheadTiles * R, R, xoff);
    __m256 acc[R][NV];
    const float* xr[R];
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      xr[i] = x + int64_t{src[p + i]} * cin + xoff;
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_setzero_ps();
    }
    for (int64_t c = 0; c < cig; ++c) {
      __m256 wv[NV];
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) wv[v] = _mm256_loadu_ps(wg + c * cog + 8 * v);
#pragma GCC unroll 12
      for (int i = 0; i < R; ++i) {
        const __m256 xb = _mm256_broadcast_ss(xr[i] + c);
#pragma GCC unroll 2
        for (int v = 0; v < NV; ++v) acc[i][v] = _mm256_fmadd_ps(xb, wv[v], acc[i][v]);
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      float* yr = y + int64_t{dst[p + i]} * cout + yoff;
#pragma GCC unroll 2
      for (int v = 0; v < NV; ++v) _mm256_storeu_ps(yr + 8 * v, _mm256_add_ps(_mm256_loadu_ps(yr + 8 * v), acc[i][v]));
    }
  }
}

template <int NV, std::size_t... I>
constexpr std::array<BucketTile, sizeof...(I)> bucket_tiles256(std::index_sequence<I...>) {
  return {bucket_tile256<NV, static_cast<int>(I) + 1>...};
}
// 12 accumulators of the 16 registers: 12 pairs of one vector, or 6 pairs of two; [r - 1]: the tile of r pairs.
constexpr std::array<BucketTile, 12> kBucketTiles256x1 = bucket_tiles256<1>(std::make_index_sequence<12>());
constexpr std::array<BucketTile, 6> kBucketTiles256x2 = bucket_tiles256<2>(std::make_index_sequence<6>());

}  // namespace

// Each group in turn, columns 16 at a time, the last 8 alone (cog a multiple of 8).
void group_pairs256(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog, int64_t groups,
                    const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead, int64_t cout, float* y) {
  for (int64_t g = 0; g < groups; ++g) {
    const float* w = wg + g * cig * cog;
    const int64_t xo = g * cig, yo = g * cog;
    int64_t t0 = 0;
    for (; t0 + 16 <= cog; t0 += 16)
      bucket_pairs(kBucketTiles256x2.data(), 6, x, cin, w + t0, cig, cog, src, dst, m, ahead, t0 == 0 ? cig : 0, xo,
                   yo + t0, cout, y);
    if (t0 < cog)
      bucket_pairs(kBucketTiles256x1.data(), 12, x, cin, w + t0, cig, cog, src, dst, m, ahead, t0 == 0 ? cig : 0,
                   xo, yo + t0, cout, y);
  }
}

}  // namespace grouped
}  // namespace native
}  // namespace spconv
#endif  // SPCONV_HAVE_AVX2_PATH
