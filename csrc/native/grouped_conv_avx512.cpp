// The AVX-512 bodies of the grouped convolution (grouped_conv.h) for float, on CPUs that have it: the table
// compactions (compress), the row loops and the bucketed forward's tiles. A 128-channel row fits 8 registers, so
// a depthwise row is one pass over its pairs, and a grouped row takes half the instructions of the AVX2 loops.
// Each output element is the same chain of FMAs in pair order as on the AVX2 path: the same bits.
#include "grouped_conv_rows.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>

#include <array>
#include <utility>

#include "lane_masks.h"

namespace spconv {
namespace native {
namespace grouped {

// compact_rows_base with 16 entries per step: one unsigned compare finds the valid ones (-1 wraps above any
// row count) and a register compress packs them (a compress straight to memory is slow on some CPUs). Each
// store writes 16 lanes: the buffers keep 16 entries of slack.
SPCONV_TARGET_AVX512 bool compact_rows_avx512(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c) {
  const int64_t kvol = s.kvol;
  const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(s.n_other)), none = _mm512_set1_epi32(-1);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __mmask16 bad = 0;
  int64_t n = 0;
  for (int64_t r = r0; r < r1; ++r) {
    c.start[r - r0] = n;
    const int32_t* t = s.table + r * kvol;
    for (int64_t j0 = 0; j0 < kvol; j0 += 16) {
      const __mmask16 in = lanes16(kvol - j0);
      const __m512i v = _mm512_maskz_loadu_epi32(in, t + j0);
      const __mmask16 ok = _mm512_mask_cmplt_epu32_mask(in, v, limit);
      bad |= in & ~ok & ~_mm512_cmpeq_epi32_mask(v, none);
      _mm512_storeu_si512(c.other.data() + n, _mm512_maskz_compress_epi32(ok, v));
      const __m512i k = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(j0)));
      _mm512_storeu_si512(c.offset.data() + n, _mm512_maskz_compress_epi32(ok, k));
      n += __builtin_popcount(ok);
    }
  }
  c.start[r1 - r0] = n;
  return bad == 0;
}

// compact_columns_base 16 rows per step: a strided gather, one unsigned compare and two compresses.
SPCONV_TARGET_AVX512 bool compact_columns_avx512(const GroupedRows& s, int64_t r0, int64_t r1, int64_t* start,
                                                 int32_t* dst, int32_t* src) {
  const int64_t kvol = s.kvol;
  const __m512i limit = _mm512_set1_epi32(static_cast<int32_t>(s.n_other)), none = _mm512_set1_epi32(-1);
  const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i stride = _mm512_mullo_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(kvol)));
  __mmask16 bad = 0;
  int64_t n = 0;
  for (int64_t k = 0; k < kvol; ++k) {
    start[k] = n;
    for (int64_t q = r0; q < r1; q += 16) {
      const __mmask16 in = lanes16(r1 - q);
      const __m512i v = _mm512_mask_i32gather_epi32(none, in, stride, s.table + q * kvol + k, 4);
      const __mmask16 ok = _mm512_mask_cmplt_epu32_mask(in, v, limit);
      bad |= in & ~ok & ~_mm512_cmpeq_epi32_mask(v, none);
      _mm512_storeu_si512(src + n, _mm512_maskz_compress_epi32(ok, v));
      const __m512i rows = _mm512_add_epi32(iota, _mm512_set1_epi32(static_cast<int32_t>(q)));
      _mm512_storeu_si512(dst + n, _mm512_maskz_compress_epi32(ok, rows));
      n += __builtin_popcount(ok);
    }
  }
  start[kvol] = n;
  return bad == 0;
}

namespace {

// Depthwise forward, columns [c0, c0 + n) of one row (n <= 16 * NV). Stream: whole, 64-byte aligned vectors
// stored past the cache (see kStreamOutputBytes).
template <int NV, bool Stream = false>
SPCONV_TARGET_AVX512 void depthwise_tile512(const float* x, const float* w, int64_t C, const PairList& l, int64_t c0,
                                            int64_t n, float* yrow) {
  __m512 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm512_setzero_ps();
  if (n == 16 * NV) {
    for (int64_t j = 0; j < l.n; ++j) {
      const float* xo = x + int64_t{l.other[j]} * C + c0;
      const float* wk = w + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm512_fmadd_ps(_mm512_loadu_ps(xo + 16 * v), _mm512_loadu_ps(wk + 16 * v), acc[v]);
    }
  } else {
    __mmask16 m[NV];
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) m[v] = lanes16(n - 16 * v);
    for (int64_t j = 0; j < l.n; ++j) {
      const float* xo = x + int64_t{l.other[j]} * C + c0;
      const float* wk = w + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v)
        acc[v] = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m[v], xo + 16 * v), _mm512_maskz_loadu_ps(m[v], wk + 16 * v),
                                 acc[v]);
    }
  }
  if constexpr (Stream) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_stream_ps(yrow + c0 + 16 * v, acc[v]);
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(yrow + c0 + 16 * v, lanes16(n - 16 * v), acc[v]);
  }
}

// Grouped forward, groups [g, g + GB), columns [t0, t0 + 16 * NV) of each group's cog (a multiple of 16), one
// row. GB groups at once give GB * NV independent accumulators: enough FMA chains in flight to cover the FMA
// latency (one group of two vectors would wait on it), and each element's chain is unchanged.
template <int NV, int GB>
SPCONV_TARGET_AVX512 void group_tile512(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog,
                                        const PairList& l, int64_t g, int64_t t0, float* yrow) {
  __m512 acc[GB][NV];
#pragma GCC unroll 8
  for (int b = 0; b < GB; ++b)
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) acc[b][v] = _mm512_setzero_ps();
  const int64_t cin = G * cig, wgs = cig * cog;
  for (int64_t j = 0; j < l.n; ++j) {
    const float* xo = x + int64_t{l.other[j]} * cin + g * cig;
    const float* wg = w + ((int64_t{l.offset[j]} * G + g) * cig) * cog + t0;
    for (int64_t c = 0; c < cig; ++c) {
#pragma GCC unroll 8
      for (int b = 0; b < GB; ++b) {
        const __m512 xb = _mm512_set1_ps(xo[b * cig + c]);
#pragma GCC unroll 8
        for (int v = 0; v < NV; ++v)
          acc[b][v] = _mm512_fmadd_ps(xb, _mm512_loadu_ps(wg + b * wgs + c * cog + 16 * v), acc[b][v]);
      }
    }
  }
#pragma GCC unroll 8
  for (int b = 0; b < GB; ++b) {
    float* yg = yrow + (g + b) * cog + t0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(yg + 16 * v, acc[b][v]);
  }
}

constexpr int64_t kColTile512 = 128;
constexpr DepthwiseTile kDepthwiseTiles512[] = {depthwise_tile512<1>, depthwise_tile512<2>, depthwise_tile512<3>,
                                                depthwise_tile512<4>, depthwise_tile512<5>, depthwise_tile512<6>,
                                                depthwise_tile512<7>, depthwise_tile512<8>};
// [NV - 1]: GB groups at once (about 8 accumulators), and the single-group tile for the groups left over.
constexpr GroupTile kGroupTiles512[] = {group_tile512<1, 8>, group_tile512<2, 4>, group_tile512<3, 2>,
                                        group_tile512<4, 2>, group_tile512<5, 1>, group_tile512<6, 1>,
                                        group_tile512<7, 1>, group_tile512<8, 1>};
constexpr int kGroupsAtOnce512[] = {8, 4, 2, 2, 1, 1, 1, 1};
constexpr GroupTile kGroupTiles512Single[] = {group_tile512<1, 1>, group_tile512<2, 1>, group_tile512<3, 1>,
                                              group_tile512<4, 1>, group_tile512<5, 1>, group_tile512<6, 1>,
                                              group_tile512<7, 1>, group_tile512<8, 1>};

// Loads and stores of a depthwise tile's vectors: whole, or under each vector's lane mask.
struct WholeVectors {
  SPCONV_TARGET_AVX512 static __m512 load(__mmask16, const float* p) { return _mm512_loadu_ps(p); }
  SPCONV_TARGET_AVX512 static void store(__mmask16, float* p, __m512 v) { _mm512_storeu_ps(p, v); }
};
struct MaskedVectors {
  SPCONV_TARGET_AVX512 static __m512 load(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
  SPCONV_TARGET_AVX512 static void store(__mmask16 m, float* p, __m512 v) { _mm512_mask_storeu_ps(p, m, v); }
};

// One input row's pairs: acc (dx) += dy[o] * w[k], and the dW partial row k += x[i] * dy[o], in place.
template <int NV, typename Mem>
SPCONV_TARGET_AVX512 inline void depthwise_backward_pairs512(const float* w, const float* dy, int64_t C,
                                                             const PairList& l, int64_t c0, const __mmask16* m,
                                                             const __m512* xi, __m512* acc, float* part) {
  for (int64_t j = 0; j < l.n; ++j) {
    const float* d = dy + int64_t{l.other[j]} * C + c0;
    const float* wk = w + int64_t{l.offset[j]} * C + c0;
    float* pk = part + int64_t{l.offset[j]} * C + c0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const __m512 dv = Mem::load(m[v], d + 16 * v);
      acc[v] = _mm512_fmadd_ps(dv, Mem::load(m[v], wk + 16 * v), acc[v]);
      Mem::store(m[v], pk + 16 * v, _mm512_fmadd_ps(xi[v], dv, Mem::load(m[v], pk + 16 * v)));
    }
  }
}

// Depthwise backward of one input row i, columns [c0, c0 + n) (n <= 16 * NV): as depthwise_backward_tile, in
// one pass for a 128-channel row; each element's chains are the AVX2 tile's. Stream: as depthwise_tile512's.
template <int NV, bool Stream = false>
SPCONV_TARGET_AVX512 void depthwise_backward_tile512(const float* x, const float* w, const float* dy, int64_t C,
                                                     const PairList& l, int64_t i, int64_t c0, int64_t n, float* dx,
                                                     float* part) {
  __m512 acc[NV], xi[NV];
  __mmask16 m[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    m[v] = lanes16(n - 16 * v);
    acc[v] = _mm512_setzero_ps();
    xi[v] = _mm512_maskz_loadu_ps(m[v], x + i * C + c0 + 16 * v);
  }
  // Whole vectors take plain loads and stores (masked ones are slower on some CPUs).
  if (n == 16 * NV) depthwise_backward_pairs512<NV, WholeVectors>(w, dy, C, l, c0, m, xi, acc, part);
  else depthwise_backward_pairs512<NV, MaskedVectors>(w, dy, C, l, c0, m, xi, acc, part);
  if constexpr (Stream) {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_stream_ps(dx + i * C + c0 + 16 * v, acc[v]);
  } else {
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) _mm512_mask_storeu_ps(dx + i * C + c0 + 16 * v, m[v], acc[v]);
  }
}

constexpr DepthwiseBackwardTile kDepthwiseBackwardTiles512[] = {
    depthwise_backward_tile512<1>, depthwise_backward_tile512<2>, depthwise_backward_tile512<3>,
    depthwise_backward_tile512<4>, depthwise_backward_tile512<5>, depthwise_backward_tile512<6>,
    depthwise_backward_tile512<7>, depthwise_backward_tile512<8>};

}  // namespace

bool depthwise_backward_rows_avx512(const float* x, const float* w, const float* dy, int64_t C,
                                    const GroupedRows& s, int64_t i0, int64_t i1, float* dx, float* part,
                                    bool stream) {
  // stream: C % 128 == 0 and dx 64-byte aligned (grouped_backward checks), so every tile is 128 whole channels.
  const bool ok = walk_rows(s, i0, i1, [&](int64_t i, const PairList& l) {
    for (int64_t c0 = 0; c0 < C; c0 += 128) {
      const int64_t n = std::min<int64_t>(128, C - c0);
      const DepthwiseBackwardTile tile =
          stream ? depthwise_backward_tile512<8, true> : kDepthwiseBackwardTiles512[(n + 15) / 16 - 1];
      tile(x, w, dy, C, l, i, c0, n, dx, part);
    }
  }, Ahead{dy, C});
  if (stream) _mm_sfence();  // the streamed rows are visible before the task ends
  return ok;
}

bool forward_rows_avx512(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                         int64_t r0, int64_t r1, float* y, bool stream) {
  if (cig == 1 && cog == 1) {
    const int64_t C = G;
    // stream: C % 128 == 0 and y 64-byte aligned (grouped_forward checks), so every tile is 128 whole channels.
    const bool ok = walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
      for (int64_t c0 = 0; c0 < C; c0 += kColTile512) {
        const int64_t n = std::min(kColTile512, C - c0);
        const DepthwiseTile tile = stream ? depthwise_tile512<8, true> : kDepthwiseTiles512[(n + 15) / 16 - 1];
        tile(x, w, C, l, c0, n, y + r * C);
      }
    }, Ahead{x, C});
    if (stream) _mm_sfence();  // the streamed rows are visible before the task ends
    return ok;
  }
  return walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
    for (int64_t t0 = 0; t0 < cog; t0 += kColTile512) {
      const int64_t nv = std::min(kColTile512, cog - t0) / 16, gb = kGroupsAtOnce512[nv - 1];
      int64_t g = 0;
      for (; g + gb <= G; g += gb) kGroupTiles512[nv - 1](x, w, G, cig, cog, l, g, t0, y + r * G * cog);
      for (; g < G; ++g) kGroupTiles512Single[nv - 1](x, w, G, cig, cog, l, g, t0, y + r * G * cog);
    }
  });
}

namespace {

// Pairs [0, m) of one offset and GB consecutive groups (m a multiple of R), columns [t0, t0 + 16 * NV) of each
// group (GB > 1: cog == 16 * NV, the groups' filters cig * cog apart): y[dst[p]] += x[src[p]]_g @ w_g, R pairs at
// a time sharing each filter load (GB * R * NV accumulators). Every element sums its cig products in order, then
// is added to its row: neither the tile size nor GB changes the bits. Groups of 16 or 32 channels take two groups
// per tile: they share its row pointers and loop, and a 16-channel group gets more than 4 FMA chains.
template <int NV, int R, int GB = 1>
SPCONV_TARGET_AVX512 void bucket_tile512(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog,
                                         const int32_t* src, const int32_t* dst, int64_t m, const Lookahead& ahead,
                                         int64_t xoff, int64_t yoff, int64_t cout, float* y) {
  for (int64_t p = 0; p < m; p += R) {
    ahead.request(x, cin, src, p + kLookaheadTiles * R, R, xoff);
    __m512 acc[GB][R][NV];
    const float* xr[R];
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) xr[i] = x + int64_t{src[p + i]} * cin + xoff;
#pragma GCC unroll 2
    for (int b = 0; b < GB; ++b)
#pragma GCC unroll 12
      for (int i = 0; i < R; ++i)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) acc[b][i][v] = _mm512_setzero_ps();
    for (int64_t c = 0; c < cig; ++c) {
#pragma GCC unroll 2
      for (int b = 0; b < GB; ++b) {
        __m512 wv[NV];
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) wv[v] = _mm512_loadu_ps(wg + b * cig * cog + c * cog + 16 * v);
#pragma GCC unroll 12
        for (int i = 0; i < R; ++i) {
          const __m512 xb = _mm512_set1_ps(xr[i][b * cig + c]);
#pragma GCC unroll 4
          for (int v = 0; v < NV; ++v) acc[b][i][v] = _mm512_fmadd_ps(xb, wv[v], acc[b][i][v]);
        }
      }
    }
#pragma GCC unroll 12
    for (int i = 0; i < R; ++i) {
      float* yr = y + int64_t{dst[p + i]} * cout + yoff;
#pragma GCC unroll 2
      for (int b = 0; b < GB; ++b)
#pragma GCC unroll 4
        for (int v = 0; v < NV; ++v) {
          float* e = yr + b * cog + 16 * v;
          _mm512_storeu_ps(e, _mm512_add_ps(_mm512_loadu_ps(e), acc[b][i][v]));
        }
    }
  }
}

// [NV - 1]: R pairs per tile, about 24 accumulators of the 32 registers (NV more hold the filter vectors).
constexpr int kBucketPairs[] = {4, 8, 8, 6};
// Two groups per tile (cog of one or two vectors): [NV - 1]: R pairs, 16 or 24 accumulators.
constexpr int kBucketPairs2[] = {8, 6};

template <int NV, int GB, std::size_t... I>
constexpr std::array<BucketTile, sizeof...(I)> bucket_tiles(std::index_sequence<I...>) {
  return {bucket_tile512<NV, static_cast<int>(I) + 1, GB>...};
}
// [NV - 1][r - 1]: the tile of r pairs; the whole tiles take kBucketPairs[NV - 1] (bucket_pairs).
constexpr std::array<BucketTile, 8> kBucketTiles[] = {bucket_tiles<1, 1>(std::make_index_sequence<8>()),
                                                      bucket_tiles<2, 1>(std::make_index_sequence<8>()),
                                                      bucket_tiles<3, 1>(std::make_index_sequence<8>()),
                                                      bucket_tiles<4, 1>(std::make_index_sequence<8>())};
// The same with two groups per tile, [NV - 1][r - 1] for NV = 1, 2.
constexpr std::array<BucketTile, 8> kBucketTiles2[] = {bucket_tiles<1, 2>(std::make_index_sequence<8>()),
                                                       bucket_tiles<2, 2>(std::make_index_sequence<8>())};

}  // namespace

// Groups of one or two vectors two at a time; the others (and a last odd group) columns 64 at a time (cog a
// multiple of 16).
void group_pairs512(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog, int64_t groups,
                    const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead, int64_t cout, float* y) {
  int64_t g = 0;
  if (cog <= 32) {
    const int64_t nv = cog / 16;
    for (; g + 2 <= groups; g += 2)
      bucket_pairs(kBucketTiles2[nv - 1].data(), kBucketPairs2[nv - 1], x, cin, wg + g * cig * cog, cig, cog, src,
                   dst, m, ahead, 2 * cig, g * cig, g * cog, cout, y);
  }
  for (; g < groups; ++g)
    for (int64_t t0 = 0; t0 < cog; t0 += 64) {
      const int64_t nv = std::min<int64_t>(64, cog - t0) / 16;
      bucket_pairs(kBucketTiles[nv - 1].data(), kBucketPairs[nv - 1], x, cin, wg + g * cig * cog + t0, cig, cog,
                   src, dst, m, ahead, t0 == 0 ? cig : 0, g * cig, g * cog + t0, cout, y);
    }
}

}  // namespace grouped
}  // namespace native
}  // namespace spconv
#endif  // SPCONV_HAVE_AVX2_PATH
