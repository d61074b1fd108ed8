#include "grouped_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "fused_gemm.h"
#include "one_thread_gemm.h"
#include "prefetch_rows.h"
#include "run_tasks.h"
#include "simd.h"
#include "split_k.h"
#include "weight_grad_loop.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

namespace {

// Destination rows per parallel task of the forward: fixed, and each row is independent of the others.
constexpr int64_t kRowGrain = 128;
// Depthwise outputs of at least this many bytes are stored past the cache.
constexpr int64_t kStreamOutputBytes = int64_t{32} << 20;
// Output columns accumulated in registers at a time (8 AVX vectors).
constexpr int64_t kColTile = 64;

// Backward: fixed blocks of input rows, each with its own dW partial (summed in block order). The block count
// depends on the sizes only (never on the thread count) and is bounded by the partials' memory.
constexpr int64_t kMinBlockRows = 1024, kMaxBlocks = 64, kPartialBudget = int64_t{16} << 20;
// Beyond this many bytes of dW, a rank-1 update per pair streams the partial through the cache: dW goes by
// per-offset GEMMs instead.
constexpr int64_t kSinglePassPartialBytes = int64_t{256} << 10;
// Groups of at least this many input and output channels go the two-pass way too: dX through the grouped
// forward's kernels and dW through the fused (or vendor) GEMMs beat the single pass's per-pair loop. Real scan,
// 128 channels, AVX-512 / AVX2: 8 channels per group (g=16) 2.1x / 2.6x, 16 (g=8) 4.6x / 4.1x faster; 4 (g=32)
// 1.3x / 1.1x slower.
constexpr int64_t kTwoPassGroupChannels = 8;

// One destination row's pairs, in offset order: the other side's rows and the offsets.
struct PairList {
  const int32_t* other;
  const int32_t* offset;
  int64_t n;
};

// A chunk of table rows compacted into their valid entries (CSR), so that the row loops see only real pairs.
struct CompactRows {
  std::vector<int64_t> start;
  std::vector<int32_t> other, offset;
};

// Table rows per compaction (at most 64, about 4096 entries): they stay in L1 between the compaction and the
// row loop.
constexpr int64_t kCompactRows = 64, kCompactEntries = 4096;

// Rows [r0, r1) of the table into c; false when an entry lies outside [-1, n_other). Branch-free: which
// entries are valid is data, and a mispredicted branch per entry costs more than the arithmetic of a
// depthwise row.
bool compact_rows_base(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c) {
  const int64_t kvol = s.kvol;
  bool bad = false;
  int64_t n = 0;
  for (int64_t r = r0; r < r1; ++r) {
    c.start[r - r0] = n;
    const int32_t* t = s.table + r * kvol;
    for (int64_t j = 0; j < kvol; ++j) {
      const int32_t v = t[j];
      const bool ok = v >= 0 && v < s.n_other;
      bad |= !ok && v != -1;
      c.other[n] = v;
      c.offset[n] = static_cast<int32_t>(j);
      n += ok;
    }
  }
  c.start[r1 - r0] = n;
  return !bad;
}

// The table rows [r0, r1) bucketed by offset: for each offset k in turn, its valid entries in row order (src
// the entry, dst the row), start[k] where they begin (start has kvol + 1 entries). Branch-free, as
// compact_rows_base; dst and src hold (r1 - r0) * kvol + 16 entries. False when an entry lies outside
// [-1, n_other).
bool compact_columns_base(const GroupedRows& s, int64_t r0, int64_t r1, int64_t* start, int32_t* dst, int32_t* src) {
  const int64_t kvol = s.kvol;
  bool bad = false;
  int64_t n = 0;
  for (int64_t k = 0; k < kvol; ++k) {
    start[k] = n;
    const int32_t* col = s.table + r0 * kvol + k;
    for (int64_t r = r0; r < r1; ++r, col += kvol) {
      const int32_t v = *col;
      const bool ok = v >= 0 && v < s.n_other;
      bad |= !ok && v != -1;
      dst[n] = static_cast<int32_t>(r);
      src[n] = v;
      n += ok;
    }
  }
  start[kvol] = n;
  return !bad;
}

#if SPCONV_HAVE_AVX2_PATH
SPCONV_TARGET_AVX512 inline __mmask16 lanes16(int64_t lanes) {
  return lanes >= 16 ? __mmask16(0xffff) : __mmask16((1u << (lanes > 0 ? lanes : 0)) - 1u);
}

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

// compact_columns_base 16 rows per step: a strided gather, one unsigned compare and two compresses (the scalar
// walk took a tenth of a g=4 forward on an AVX-512 CPU).
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

SPCONV_TARGET_AVX2 inline __m256i tail_mask(int64_t lanes) {  // the first `lanes` (0-8) lanes set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// compact_rows_avx512 with 8 entries per step: AVX2 has no compress, so a lane permutation looked up by the
// valid mask packs them (measured: the scalar loop took half of a depthwise forward's time on an AVX2 CPU).
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
#endif

// Rows of x (cols values each) that a walk requests a few rows ahead of its body (x == nullptr: none).
struct Ahead {
  const float* x = nullptr;
  int64_t cols = 0;
};
constexpr int64_t kAheadRows = 2;

// Hands body(r, pairs) every row of [r0, r1) in order; a table's rows are compacted a chunk at a time.
// Entries outside [-1, n_other) are skipped and make it return false. With `ahead`, the gathered rows of the
// pairs kAheadRows rows on are prefetched first (depthwise loops on a real scan: AVX2 forward 15-25% faster;
// AVX-512, C=128, alternating builds: forward 8%, backward 5%).
template <typename Body>
bool walk_rows(const GroupedRows& s, int64_t r0, int64_t r1, Body&& body, Ahead ahead = {}) {
  if (s.table == nullptr) {
    for (int64_t r = r0; r < r1; ++r) {
      if (ahead.x != nullptr && r + kAheadRows < r1) {
        const int64_t a = r + kAheadRows;
        prefetch_rows(ahead.x, ahead.cols, s.other + s.start[a], s.start[a + 1] - s.start[a]);
      }
      body(r, PairList{s.other + s.start[r], s.offset + s.start[r], s.start[r + 1] - s.start[r]});
    }
    return true;
  }
  if (r0 >= r1) return true;
  // One buffer per thread, kept across calls: a task of 128 rows would otherwise spend a fair share of its
  // time allocating and zeroing it.
  thread_local CompactRows c;
  const int64_t chunk = std::clamp<int64_t>(std::min(kCompactRows, kCompactEntries / s.kvol), 1, r1 - r0);
  const size_t entries = static_cast<size_t>(chunk * s.kvol + 16);
  if (c.start.size() < static_cast<size_t>(chunk + 1)) c.start.resize(chunk + 1);
  if (c.other.size() < entries) c.other.resize(entries);
  if (c.offset.size() < entries) c.offset.resize(entries);
  bool ok = true;
  for (int64_t q0 = r0; q0 < r1; q0 += chunk) {
    const int64_t q1 = std::min(r1, q0 + chunk);
    // The next chunk's table rows, requested while this chunk's rows compute (AVX-512, real scan, depthwise
    // C=128: forward and backward 4% faster; the AVX2 loops gained nothing).
    if (cpu_has_avx512f() && q1 < r1) {
      const int32_t* t = s.table + q1 * s.kvol;
      const int32_t* e = s.table + std::min(r1, q1 + chunk) * s.kvol;
      for (; t < e; t += 64 / sizeof(int32_t)) __builtin_prefetch(t, 0, 2);
    }
#if SPCONV_HAVE_AVX2_PATH
    ok &= cpu_has_avx512f()  ? compact_rows_avx512(s, q0, q1, c)
           : cpu_has_avx2_fma() ? compact_rows_avx2(s, q0, q1, c)
                                : compact_rows_base(s, q0, q1, c);
#else
    ok &= compact_rows_base(s, q0, q1, c);
#endif
    for (int64_t r = q0; r < q1; ++r) {
      const int64_t b = c.start[r - q0];
      if (ahead.x != nullptr && r + kAheadRows < q1) {
        const int64_t a = c.start[r + kAheadRows - q0];
        prefetch_rows(ahead.x, ahead.cols, c.other.data() + a, c.start[r + kAheadRows - q0 + 1] - a);
      }
      body(r, PairList{c.other.data() + b, c.offset.data() + b, c.start[r - q0 + 1] - b});
    }
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------------------
// Portable loops (double; float on CPUs without AVX2/FMA, and shapes the vector loops don't take).

template <typename T>
bool forward_rows_base(const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, T* y) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  return walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
    T* yr = y + r * cout;
    std::fill(yr, yr + cout, T(0));
    for (int64_t j = 0; j < l.n; ++j) {
      const T* xo = x + int64_t{l.other[j]} * cin;
      const T* wk = w + int64_t{l.offset[j]} * wk_size;
      if (cig == 1 && cog == 1) {  // depthwise: one product per channel
        for (int64_t c = 0; c < cout; ++c) yr[c] += xo[c] * wk[c];
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        T* yg = yr + g * cog;
        for (int64_t c = 0; c < cig; ++c) {
          const T xv = xo[g * cig + c];
          const T* wr = wk + (g * cig + c) * cog;
          for (int64_t t = 0; t < cog; ++t) yg[t] += xv * wr[t];
        }
      }
    }
  });
}

// Input rows [i0, i1): dx rows and their pairs' share of dW into part [kvol, G, cig, cog] (zero on entry).
template <typename T>
bool backward_rows_base(const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                        const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  return walk_rows(s, i0, i1, [&](int64_t i, const PairList& l) {
    const T* xi = x + i * cin;
    T* dxi = dx + i * cin;
    std::fill(dxi, dxi + cin, T(0));
    for (int64_t j = 0; j < l.n; ++j) {
      const T* d = dy + int64_t{l.other[j]} * cout;
      const T* wk = wt + int64_t{l.offset[j]} * wk_size;
      T* pk = part + int64_t{l.offset[j]} * wk_size;
      if (cig == 1 && cog == 1) {
        for (int64_t c = 0; c < cin; ++c) {
          dxi[c] += d[c] * wk[c];
          pk[c] += xi[c] * d[c];
        }
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const T* dg = d + g * cog;
        T* dxg = dxi + g * cig;
        for (int64_t t = 0; t < cog; ++t) {  // dx_g += dy_g @ W^T, W^T rows contiguous
          const T dv = dg[t];
          const T* wr = wk + (g * cog + t) * cig;
          for (int64_t c = 0; c < cig; ++c) dxg[c] += dv * wr[c];
        }
        for (int64_t c = 0; c < cig; ++c) {  // dW_g += x_g^T dy_g
          const T xv = xi[g * cig + c];
          T* pr = pk + (g * cig + c) * cog;
          for (int64_t t = 0; t < cog; ++t) pr[t] += xv * dg[t];
        }
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------------------
// AVX2/FMA loops for float: whole-vector loads, the last vector of a row masked.

#if SPCONV_HAVE_AVX2_PATH

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

// A whole row of C % 64 == 0 channels, every tile in one call: a call per tile cost a depthwise forward about
// 10% of its compute (measured on an AVX2 CPU with every row in L1).
template <bool Stream>
SPCONV_TARGET_AVX2 void depthwise_row(const float* x, const float* w, int64_t C, const PairList& l, float* yrow) {
  for (int64_t c0 = 0; c0 < C; c0 += kColTile) depthwise_tile<8, Stream>(x, w, C, l, c0, kColTile, yrow);
}

using DepthwiseTile = void (*)(const float*, const float*, int64_t, const PairList&, int64_t, int64_t, float*);
constexpr DepthwiseTile kDepthwiseTiles[] = {depthwise_tile<1>, depthwise_tile<2>, depthwise_tile<3>,
                                             depthwise_tile<4>, depthwise_tile<5>, depthwise_tile<6>,
                                             depthwise_tile<7>, depthwise_tile<8>};
using GroupTile = void (*)(const float*, const float*, int64_t, int64_t, int64_t, const PairList&, int64_t, int64_t,
                           float*);
constexpr GroupTile kGroupTiles[] = {group_tile<1>, group_tile<2>, group_tile<3>, group_tile<4>,
                                     group_tile<5>, group_tile<6>, group_tile<7>, group_tile<8>};

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

using DepthwiseBackwardTile = void (*)(const float*, const float*, const float*, int64_t, const PairList&, int64_t,
                                       int64_t, int64_t, float*, float*);
constexpr DepthwiseBackwardTile kDepthwiseBackwardTiles[] = {
    depthwise_backward_tile<1>, depthwise_backward_tile<2>, depthwise_backward_tile<3>, depthwise_backward_tile<4>,
    depthwise_backward_tile<5>, depthwise_backward_tile<6>, depthwise_backward_tile<7>, depthwise_backward_tile<8>};

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
#endif  // SPCONV_HAVE_AVX2_PATH

// ---------------------------------------------------------------------------------------------------------
// AVX-512 loops for float (CPUs that have it): a 128-channel row fits 8 registers, so a depthwise row is one
// pass over its pairs, and a grouped row takes half the instructions of the AVX2 loops. Each output element is
// the same chain of FMAs in pair order as on the AVX2 path: the same bits.
#if SPCONV_HAVE_AVX2_PATH

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
  // Whole vectors take plain loads and stores (masked ones took 10-18% longer on Intel).
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
#endif  // SPCONV_HAVE_AVX2_PATH

bool avx2_float(const at::Tensor& t) { return t.scalar_type() == at::kFloat && cpu_has_avx2_fma(); }

// A depthwise output (y, or dx) much larger than the cache is written once and read by the next layer from
// memory anyway: streamed past the cache it is not read in first (a third of the layer's memory traffic).
// The vector loops stream whole tiles (128 channels on AVX-512, 64 on AVX2) of 64-byte aligned rows.
bool streams_depthwise_output(int64_t G, int64_t cig, int64_t cog, const at::Tensor& out) {
  return cig == 1 && cog == 1 && G % 128 == 0 && out.scalar_type() == at::kFloat &&
         out.nbytes() >= static_cast<size_t>(kStreamOutputBytes) &&
         reinterpret_cast<uintptr_t>(out.const_data_ptr()) % 64 == 0;
}

template <typename T>
bool forward_rows(bool avx2, const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                  int64_t r0, int64_t r1, T* y, bool stream) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    const bool depthwise = cig == 1 && cog == 1;
    if (avx2 && cpu_has_avx512f() && (depthwise || cog % 16 == 0))
      return forward_rows_avx512(x, w, G, cig, cog, s, r0, r1, y, stream);
    if (avx2 && (depthwise || cog % 8 == 0)) return forward_rows_avx2(x, w, G, cig, cog, s, r0, r1, y, stream);
  }
#endif
  (void)avx2;
  (void)stream;
  return forward_rows_base(x, w, G, cig, cog, s, r0, r1, y);
}

template <typename T>
bool backward_rows(bool avx2, const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                   const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part, bool stream) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    if (avx2 && cig == 1 && cog == 1 && cpu_has_avx512f())
      return depthwise_backward_rows_avx512(x, wt, dy, G, s, i0, i1, dx, part, stream);
    if (avx2 && cig == 1 && cog == 1) return depthwise_backward_rows_avx2(x, wt, dy, G, s, i0, i1, dx, part, stream);
  }
#endif
  (void)avx2;
  (void)stream;
  return backward_rows_base(x, wt, dy, G, cig, cog, s, i0, i1, dx, part);
}

// ---------------------------------------------------------------------------------------------------------
// dW of general groups: a rank-1 update of a cig x cog block per pair would read and write the partial once per
// pair; grouping the pairs by offset turns it into GEMMs (X_g^T dY_g over gathered rows) that keep the block in
// registers. Segments of an offset's pairs (fixed by the sizes) sum into partials of their own, added in order.

struct PairsByOffset {
  std::vector<int64_t> start;  // [kvol + 1]
  std::vector<int32_t> in, out;
};

// The pairs of `rows` (rows = inputs) grouped by offset, each offset's in input-row order. False when a table
// entry is out of range (skipped).
bool pairs_by_offset(const GroupedRows& s, PairsByOffset& p) {
  p.start.assign(s.kvol + 1, 0);
  const bool ok = walk_rows(s, 0, s.rows, [&](int64_t, const PairList& l) {
    for (int64_t j = 0; j < l.n; ++j) ++p.start[l.offset[j] + 1];
  });
  for (int64_t k = 0; k < s.kvol; ++k) p.start[k + 1] += p.start[k];
  std::vector<int64_t> cur(p.start.begin(), p.start.end() - 1);
  p.in.resize(p.start.back());
  p.out.resize(p.start.back());
  walk_rows(s, 0, s.rows, [&](int64_t i, const PairList& l) {
    for (int64_t j = 0; j < l.n; ++j) {
      const int64_t slot = cur[l.offset[j]]++;
      p.in[slot] = static_cast<int32_t>(i);
      p.out[slot] = l.other[j];
    }
  });
  return ok;
}

template <typename T>
void gather(const T* src, int64_t c, const int32_t* idx, int64_t m, T* buf) {
  for (int64_t r = 0; r < m; ++r) std::copy(src + int64_t{idx[r]} * c, src + int64_t{idx[r]} * c + c, buf + r * c);
}

// Pairs per chunk of the grouped dW: every group takes the chunk in turn.
constexpr int64_t kGroupWeightGradChunk = 256;

// dw [kvol, G, cig, cog] = per offset and group, sum over the offset's pairs of x[in]_g^T dy[out]_g, split-K over
// the pairs (split_k.h). FP32/FP64 with a fused dW kernel for a group's channels (AVX-512: cog a multiple of the
// vector; AVX2: float, cog a multiple of 8 up to 64): each group's slice of the pairs' rows straight into the
// multiply, no gather buffers (g=4, 128 channels, real scan: the gathers and vendor GEMMs had taken half the
// backward). Otherwise gathered chunks through the vendor GEMM.
void weight_grad_gemm(const at::Tensor& x, const at::Tensor& dy, const PairsByOffset& p, at::Tensor& dw) {
  const int64_t kvol = dw.size(0), G = dw.size(1), cig = dw.size(2), cog = dw.size(3);
  const int64_t cin = x.size(1), cout = dy.size(1);
  const bool fused = x.scalar_type() == at::kFloat    ? fused_weight_grad_ok<float>(cig, cog)
                     : x.scalar_type() == at::kDouble ? fused_weight_grad_ok<double>(cig, cog)
                                                      : false;
  const SplitK plan = plan_split_k(p.start.data(), kvol, cin, cout, x.element_size(), dw);
  const std::vector<KSegment>& segs = plan.segs;
  const int64_t rows = plan.rows;
  at::Tensor part = at::empty({plan.n_partials, G, cig, cog}, x.options());
  PartialsCountdown sums(plan, kvol);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_weight_grad", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      if (fused) {
        run_tasks(static_cast<int64_t>(segs.size()), [&] {
          return [&](int64_t t) {
            const KSegment& sg = segs[t];
            scalar_t* acc = (sg.slot < 0 ? dw[sg.k] : part[sg.slot]).mutable_data_ptr<scalar_t>();
            // Chunks of pairs, every group in turn: the chunk's rows stay in L2 for the groups after the first
            // (g=4, 128 channels: 10% faster than each group over the whole segment).
            for (int64_t c0 = sg.begin; c0 < sg.end; c0 += kGroupWeightGradChunk)
              for (int64_t g = 0; g < G; ++g)
                fused_weight_grad(xp + g * cig, cin, cig, gp + g * cog, cout, cog, p.in.data() + c0,
                                  p.out.data() + c0, std::min(kGroupWeightGradChunk, sg.end - c0), c0 > sg.begin,
                                  acc + g * cig * cog);
            sums.segment_done(sg, part.const_data_ptr<scalar_t>(), dw.mutable_data_ptr<scalar_t>(), G * cig * cog);
          };
        });
        return;
      }
    }
    run_tasks<OneThreadGemm>(static_cast<int64_t>(segs.size()), [&] {
      at::Tensor a = at::empty({rows, cin}, x.options()), b = at::empty({rows, cout}, x.options());
      return [&, a, b](int64_t t) {
        const KSegment& sg = segs[t];
        at::Tensor acc = sg.slot < 0 ? dw[sg.k] : part[sg.slot];
        for (int64_t c0 = sg.begin; c0 < sg.end; c0 += rows) {
          const int64_t m = std::min(rows, sg.end - c0);
          gather(xp, cin, p.in.data() + c0, m, a.mutable_data_ptr<scalar_t>());
          gather(gp, cout, p.out.data() + c0, m, b.mutable_data_ptr<scalar_t>());
          for (int64_t g = 0; g < G; ++g) {
            at::Tensor lhs = a.narrow(0, 0, m).narrow(1, g * cig, cig).t(), rhs = b.narrow(0, 0, m).narrow(1, g * cog, cog);
            at::Tensor out = acc[g];
            if (c0 == sg.begin) at::mm_out(out, lhs, rhs);
            else out.addmm_(lhs, rhs);
          }
        }
        sums.segment_done(sg, part.const_data_ptr<scalar_t>(), dw.mutable_data_ptr<scalar_t>(), G * cig * cog);
      };
    });
  });
}

// ---------------------------------------------------------------------------------------------------------
// Forward of groups with many channels per group (float, AVX-512 or AVX2). A row-by-row loop loads the filter
// slice of each (pair, group) once per pair: loads, not FMAs, bound it. Here the pairs of a fixed block of
// destination rows are bucketed by offset, and 4-12 pairs of one offset share each filter load: every pair's
// product is summed in registers (input channels in order) and then added to its row, offsets in order. The
// blocks depend on the sizes only, and each row is written by its block alone: the bits don't depend on the
// thread count.
#if SPCONV_HAVE_AVX2_PATH
// Rows per block: the block's gathered input rows stay in L2 across its offsets. AVX2: 128 (measured against
// 64-1024). AVX-512: 256 since the vector compaction (real scan, 5 alternating rounds: g=4 and g=8 4-5% faster
// than 128; with the scalar compaction 128 had beaten 64, 256 and 1024).
constexpr int64_t kBucketBlockRows = 128, kBucketBlockRows512 = 256;

// Tiles ahead of the one computing whose source rows a tile requests: about 800 cycles of FMAs at 6 pairs per
// tile, longer than a miss to memory.
constexpr int64_t kLookaheadTiles = 2;

// The source rows a tile requests ahead: pairs [p, p + n) of src that lie below `pairs` (the block's pairs from
// this offset on, so that an offset's last tiles request the next offset's first rows), `cols` columns from the
// tile's xoff (0: none; the later column passes over the same rows find them in cache). Spread over the tiles, the
// requests overlap the FMAs; requested all at once per block they stalled the core for 12% of a g=4 forward.
struct Lookahead {
  int64_t pairs = 0, cols = 0;
  inline __attribute__((always_inline)) void request(const float* x, int64_t cin, const int32_t* src, int64_t p,
                                                     int64_t n, int64_t xoff) const {
    if (cols > 0 && p < pairs) prefetch_rows(x + xoff, cols, src + p, std::min(n, pairs - p), cin);
  }
};

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

using BucketTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const int32_t*, const int32_t*,
                            int64_t, const Lookahead&, int64_t, int64_t, int64_t, float*);

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

// y[dst[p]] += x[src[p]]_g @ w_g for the pairs [0, m) of one offset and `groups` consecutive groups (filters wg,
// cig * cog apart), every column of each group; `ahead`: the block's pairs from this offset on (Lookahead).
using GroupPairs = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, const int32_t*,
                            const int32_t*, int64_t, int64_t, int64_t, float*);

// The pairs [0, m) in tiles of r (tiles[r - 1]), the pairs left over in one tile of their exact count (a padded
// tile computed 11% more products than the real scan has). tiles[i]: the tile of i + 1 pairs. A pass requests
// the rows ahead only when it is the first over its columns (pf_cols != 0).
void bucket_pairs(const BucketTile* tiles, int64_t r, const float* x, int64_t cin, const float* wg, int64_t cig,
                  int64_t cog, const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead, int64_t pf_cols,
                  int64_t xoff, int64_t yoff, int64_t cout, float* y) {
  const int64_t whole = m - m % r;
  if (whole > 0) tiles[r - 1](x, cin, wg, cig, cog, src, dst, whole, Lookahead{ahead, pf_cols}, xoff, yoff, cout, y);
  if (m > whole)
    tiles[m - whole - 1](x, cin, wg, cig, cog, src + whole, dst + whole, m - whole,
                         Lookahead{ahead - whole, pf_cols}, xoff, yoff, cout, y);
}

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

// avx512: the AVX-512 tiles, block size and table compaction; else the AVX2 ones.
bool forward_bucketed(bool avx512, const float* x, const float* w, int64_t G, int64_t cig, int64_t cog,
                      const GroupedRows& s, float* y) {
  const int64_t cin = G * cig, cout = G * cog, kvol = s.kvol;
  const GroupPairs pairs = avx512 ? group_pairs512 : group_pairs256;
  const int64_t block_rows = avx512 ? kBucketBlockRows512 : kBucketBlockRows;
  const int64_t n_blocks = (s.rows + block_rows - 1) / block_rows;
  std::atomic<bool> ok{true};
  run_tasks(n_blocks, [&] {
    return [&, start = std::vector<int64_t>(kvol + 1), cur = std::vector<int64_t>(kvol), dst = std::vector<int32_t>(),
            src = std::vector<int32_t>()](int64_t b) mutable {
      const int64_t r0 = b * block_rows, r1 = std::min(s.rows, r0 + block_rows);
      if (s.table != nullptr) {
        // The block's table column by column (its rows stay in L1); entries outside [-1, n_other) are
        // skipped and flagged.
        dst.resize((r1 - r0) * kvol + 16);
        src.resize((r1 - r0) * kvol + 16);
        // The block's table rows are contiguous: requested line by line first, so that the column walk's
        // strided reads find them in cache (real scan, 128 channels, g=4 forward: AVX-512 4-6%, AVX2 2% faster).
        for (const int32_t* t = s.table + r0 * kvol, *e = s.table + r1 * kvol; t < e; t += 64 / sizeof(int32_t))
          __builtin_prefetch(t, 0, 3);
        const bool valid = avx512 ? compact_columns_avx512(s, r0, r1, start.data(), dst.data(), src.data())
                                  : compact_columns_base(s, r0, r1, start.data(), dst.data(), src.data());
        if (!valid) ok = false;
      } else {
        std::fill(start.begin(), start.end(), 0);
        walk_rows(s, r0, r1, [&](int64_t, const PairList& l) {
          for (int64_t j = 0; j < l.n; ++j) ++start[l.offset[j] + 1];
        });
        for (int64_t k = 0; k < kvol; ++k) start[k + 1] += start[k];
        dst.resize(start[kvol]);
        src.resize(start[kvol]);
        std::copy(start.begin(), start.end() - 1, cur.begin());
        walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
          for (int64_t j = 0; j < l.n; ++j) {
            const int64_t slot = cur[l.offset[j]]++;
            dst[slot] = static_cast<int32_t>(r);
            src[slot] = l.other[j];
          }
        });
      }
      // The source rows of the first tiles; the tiles request the rest as they go (Lookahead).
      prefetch_rows(x, cin, src.data(), std::min<int64_t>(start[kvol], kLookaheadTiles * 8));
      std::fill(y + r0 * cout, y + r1 * cout, 0.f);
      for (int64_t k = 0; k < kvol; ++k) {
        const int64_t m = start[k + 1] - start[k];
        if (m == 0) continue;
        pairs(x, cin, w + k * G * cig * cog, cig, cog, G, src.data() + start[k], dst.data() + start[k], m,
              start[kvol] - start[k], cout, y);
      }
    };
  });
  return ok;
}
#endif  // SPCONV_HAVE_AVX2_PATH

}  // namespace

bool grouped_forward(const at::Tensor& x, const at::Tensor& w, const GroupedRows& rows, at::Tensor& y) {
  const int64_t G = w.size(1), cig = w.size(2), cog = w.size(3);
  if (rows.rows == 0 || y.numel() == 0) return true;
#if SPCONV_HAVE_AVX2_PATH
  // Many channels per group: filter loads shared by several pairs (forward_bucketed) beat the row loop. AVX2
  // (real scan, 128 channels): g=4 1.6x, g=8 1.5x, g=16 1.4x faster.
  if (avx2_float(x)) {
    const bool avx512 = cpu_has_avx512f();
    if (avx512 ? cig >= 16 && cog % 16 == 0 : cig >= 8 && cog % 8 == 0)
      return forward_bucketed(avx512, x.const_data_ptr<float>(), w.const_data_ptr<float>(), G, cig, cog, rows,
                              y.mutable_data_ptr<float>());
  }
#endif
  const bool avx2 = avx2_float(x);
  const bool stream = streams_depthwise_output(G, cig, cog, y);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    run_tasks((rows.rows + kRowGrain - 1) / kRowGrain, [&] {
      return [&](int64_t t) {
        const int64_t r0 = t * kRowGrain, r1 = std::min(rows.rows, r0 + kRowGrain);
        if (!forward_rows(avx2, xp, wp, G, cig, cog, rows, r0, r1, yp, stream)) ok = false;
      };
    });
  });
  return ok;
}

bool grouped_backward(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& dy, const GroupedRows& rows,
                      at::Tensor& dx, at::Tensor& dw) {
  const int64_t kvol = wt.size(0), G = wt.size(1), cog = wt.size(2), cig = wt.size(3), n_in = rows.rows;
  const int64_t slice = kvol * G * cig * cog;
  if (n_in == 0 || slice == 0) {
    dx.zero_();
    dw.zero_();
    return true;
  }
  if (slice * x.element_size() > kSinglePassPartialBytes || std::min(cig, cog) >= kTwoPassGroupChannels) {
    // dX is the forward of dY over the reversed map with each group's filter transposed; dW goes by offset.
    const bool ok = grouped_forward(dy, wt, rows, dx);
    PairsByOffset p;
    const bool ok_pairs = pairs_by_offset(rows, p);
    weight_grad_gemm(x, dy, p, dw);
    return ok && ok_pairs;
  }
  // Small filters (depthwise, few channels per group): one pass, each pair's dY row read once for dX and dW,
  // the block's dW partial staying in cache.
  const int64_t by_memory = std::max<int64_t>(1, kPartialBudget / (slice * x.element_size()));
  const int64_t n_blocks = std::clamp<int64_t>((n_in + kMinBlockRows - 1) / kMinBlockRows, 1,
                                               std::min(kMaxBlocks, by_memory));
  const int64_t block = (n_in + n_blocks - 1) / n_blocks;
  at::Tensor part = at::empty({n_blocks, slice}, x.options());
  const bool avx2 = avx2_float(x);
  const bool stream = streams_depthwise_output(G, cig, cog, dx);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = wt.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    scalar_t* pp = part.mutable_data_ptr<scalar_t>();
    run_tasks(n_blocks, [&] {
      return [&](int64_t b) {
        scalar_t* pb = pp + b * slice;
        std::fill(pb, pb + slice, scalar_t(0));  // here, so each block's partial is first touched in its task
        const int64_t i0 = b * block, i1 = std::min(n_in, i0 + block);
        if (i0 < i1 && !backward_rows(avx2, xp, wp, gp, G, cig, cog, rows, i0, i1, dxp, pb, stream)) ok = false;
      };
    });
  });
  // The partials in block order: a fixed order, so the bits don't depend on the thread count.
  at::Tensor total = part[0].clone();
  for (int64_t b = 1; b < n_blocks; ++b) total.add_(part[b]);
  dw.copy_(total.view(dw.sizes()));
  return ok;
}

}  // namespace native
}  // namespace spconv
