// Pieces the grouped convolution's bodies share (grouped_conv.cpp, grouped_conv_avx2.cpp,
// grouped_conv_avx512.cpp): a destination row's pairs, the walk over a block of rows that hands them out (a
// table's rows compacted a chunk at a time), the look-ahead of the bucketed forward's tiles, and the entry
// points of the AVX2 and AVX-512 bodies. Plain C++ (no ISA attributes): every body can inline it.
#pragma once
#include <algorithm>
#include <cstdint>
#include <vector>

#include "grouped_conv.h"
#include "prefetch_rows.h"
#include "simd.h"

namespace spconv {
namespace native {
namespace grouped {

// One destination row's pairs, in offset order: the other side's rows and the offsets.
struct PairList {
  const int32_t* other;
  const int32_t* offset;
  int64_t n;
};

// A tile of one row's pairs (the row loops' tables of tiles by vector count).
using DepthwiseTile = void (*)(const float*, const float*, int64_t, const PairList&, int64_t, int64_t, float*);
using GroupTile = void (*)(const float*, const float*, int64_t, int64_t, int64_t, const PairList&, int64_t, int64_t,
                           float*);
using DepthwiseBackwardTile = void (*)(const float*, const float*, const float*, int64_t, const PairList&, int64_t,
                                       int64_t, int64_t, float*, float*);

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
inline bool compact_rows_base(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c) {
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

#if SPCONV_HAVE_AVX2_PATH
// compact_rows_base with vector compares and compresses (grouped_conv_avx512.cpp, grouped_conv_avx2.cpp). Each
// store writes whole vectors: the buffers keep 16 entries of slack.
bool compact_rows_avx512(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c);
bool compact_rows_avx2(const GroupedRows& s, int64_t r0, int64_t r1, CompactRows& c);
// compact_columns_base (grouped_conv.cpp) 16 rows per step.
bool compact_columns_avx512(const GroupedRows& s, int64_t r0, int64_t r1, int64_t* start, int32_t* dst,
                            int32_t* src);
#endif

// Rows of x (cols values each) that a walk requests a few rows ahead of its body (x == nullptr: none).
struct Ahead {
  const float* x = nullptr;
  int64_t cols = 0;
};
constexpr int64_t kAheadRows = 2;

// Hands body(r, pairs) every row of [r0, r1) in order; a table's rows are compacted a chunk at a time.
// Entries outside [-1, n_other) are skipped and make it return false. With `ahead`, the gathered rows of the
// pairs kAheadRows rows on are prefetched first (they miss the cache in no order a prefetcher follows).
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
    // The next chunk's table rows, requested while this chunk's rows compute (AVX-512 only: the AVX2 loops
    // gain nothing from it).
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

#if SPCONV_HAVE_AVX2_PATH
// Tiles ahead of the one computing whose source rows a tile requests: about 800 cycles of FMAs at 6 pairs per
// tile, longer than a miss to memory.
constexpr int64_t kLookaheadTiles = 2;

// The source rows a tile requests ahead: pairs [p, p + n) of src that lie below `pairs` (the block's pairs from
// this offset on, so that an offset's last tiles request the next offset's first rows), `cols` columns from the
// tile's xoff (0: none; the later column passes over the same rows find them in cache). Spread over the tiles, the
// requests overlap the FMAs, where requests all at once per block would stall the core.
struct Lookahead {
  int64_t pairs = 0, cols = 0;
  inline __attribute__((always_inline)) void request(const float* x, int64_t cin, const int32_t* src, int64_t p,
                                                     int64_t n, int64_t xoff) const {
    if (cols > 0 && p < pairs) prefetch_rows(x + xoff, cols, src + p, std::min(n, pairs - p), cin);
  }
};

// A tile of pairs of one offset (bucket_tile256, bucket_tile512).
using BucketTile = void (*)(const float*, int64_t, const float*, int64_t, int64_t, const int32_t*, const int32_t*,
                            int64_t, const Lookahead&, int64_t, int64_t, int64_t, float*);

// The pairs [0, m) in tiles of r (tiles[r - 1]), the pairs left over in one tile of their exact count (a padded
// tile would compute products of pairs that don't exist). tiles[i]: the tile of i + 1 pairs. A pass requests the
// rows ahead only when it is the first over its columns (pf_cols != 0).
inline void bucket_pairs(const BucketTile* tiles, int64_t r, const float* x, int64_t cin, const float* wg,
                         int64_t cig, int64_t cog, const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead,
                         int64_t pf_cols, int64_t xoff, int64_t yoff, int64_t cout, float* y) {
  const int64_t whole = m - m % r;
  if (whole > 0) tiles[r - 1](x, cin, wg, cig, cog, src, dst, whole, Lookahead{ahead, pf_cols}, xoff, yoff, cout, y);
  if (m > whole)
    tiles[m - whole - 1](x, cin, wg, cig, cog, src + whole, dst + whole, m - whole,
                         Lookahead{ahead - whole, pf_cols}, xoff, yoff, cout, y);
}

// The row loops of float (grouped_conv_avx2.cpp, grouped_conv_avx512.cpp): the forward of rows [r0, r1) (any
// groups; AVX2: cog a multiple of 8 or depthwise, AVX-512: of 16 or depthwise), and the depthwise backward of
// input rows [i0, i1) (dx and the block's dW partial). stream: whole tiles stored past the cache
// (streams_depthwise_output).
bool forward_rows_avx2(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, float* y, bool stream);
bool forward_rows_avx512(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                         int64_t r0, int64_t r1, float* y, bool stream);
bool depthwise_backward_rows_avx2(const float* x, const float* w, const float* dy, int64_t C, const GroupedRows& s,
                                  int64_t i0, int64_t i1, float* dx, float* part, bool stream);
bool depthwise_backward_rows_avx512(const float* x, const float* w, const float* dy, int64_t C,
                                    const GroupedRows& s, int64_t i0, int64_t i1, float* dx, float* part,
                                    bool stream);

// The bucketed forward's pairs of one offset (grouped_conv.cpp, forward_bucketed): y[dst[p]] += x[src[p]]_g @ w_g
// for the pairs [0, m) and `groups` consecutive groups (filters wg, cig * cog apart), every column of each group;
// `ahead`: the block's pairs from this offset on (Lookahead). AVX-512: cog a multiple of 16; AVX2: of 8.
void group_pairs512(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog, int64_t groups,
                    const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead, int64_t cout, float* y);
void group_pairs256(const float* x, int64_t cin, const float* wg, int64_t cig, int64_t cog, int64_t groups,
                    const int32_t* src, const int32_t* dst, int64_t m, int64_t ahead, int64_t cout, float* y);
#endif  // SPCONV_HAVE_AVX2_PATH

}  // namespace grouped
}  // namespace native
}  // namespace spconv
