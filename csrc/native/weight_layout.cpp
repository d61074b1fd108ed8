#include "weight_layout.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

namespace spconv {
namespace native {

namespace {

// A batch of 2-D transposes: matrix (a, b), a < outer, b < inner, reads src + a * src_outer + b * src_inner and
// writes dst + a * dst_outer + b * dst_inner (in elements): dst[j * ldd + i] = src[i * lds + j], i < rows,
// j < cols.
struct Plan {
  int64_t rows, cols, lds, ldd;
  int64_t outer, src_outer, dst_outer;
  int64_t inner, src_inner, dst_inner;
};

// Tiles of 16 x 16 elements: the tile's 16 source rows stay in L1 while it is written column by column.
constexpr int64_t kTile = 16;
// A parallel task moves at least this many bytes: smaller work stays on the calling thread (a parallel region
// costs more than it saves, and stalls when other processes hold the cores).
constexpr int64_t kTaskBytes = 512 * 1024;

template <typename E>
void transpose_tiles(const E* s, int64_t lds, int64_t rows, int64_t cols, E* d, int64_t ldd) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) d[j * ldd + i] = s[i * lds + j];
    }
  }
}

template <typename E>
void run(const Plan& p, const void* src, void* dst) {
  const E* s = static_cast<const E*>(src);
  E* d = static_cast<E*>(dst);
  // A task takes kTile rows of one inner batch through every outer matrix: in a weight those rows run on in
  // memory from one offset to the next, so the task reads them front to back (sixteen streams the prefetcher
  // follows). Matrix by matrix, each row would be read in short bursts kvol * cig elements apart, which it
  // doesn't follow: cold weights moved at under 2 GB/s that way.
  const int64_t row_blocks = (p.rows + kTile - 1) / kTile;
  const int64_t task_bytes = std::max<int64_t>(kTile * p.cols * p.outer * static_cast<int64_t>(sizeof(E)), 1);
  at::parallel_for(0, p.inner * row_blocks, std::max<int64_t>(1, kTaskBytes / task_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / row_blocks, i0 = t % row_blocks * kTile, n = std::min(kTile, p.rows - i0);
      for (int64_t a = 0; a < p.outer; ++a)
        transpose_tiles(s + a * p.src_outer + b * p.src_inner + i0 * p.lds, p.lds, n, p.cols,
                        d + a * p.dst_outer + b * p.dst_inner + i0, p.ldd);
    }
  });
}

void run_bits(const Plan& p, const void* src, void* dst, int64_t elem_size) {
  switch (elem_size) {
    case 1: return run<uint8_t>(p, src, dst);
    case 2: return run<uint16_t>(p, src, dst);
    case 4: return run<uint32_t>(p, src, dst);
    case 8: return run<uint64_t>(p, src, dst);
    default: TORCH_CHECK(false, "weight layout: elements of ", elem_size, " bytes are not supported");
  }
}

}  // namespace

void weight_to_filters(const void* weight, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* filters,
                       int64_t elem_size) {
  // Matrix (k, g): rows o of weight[g * cog + o, k, :] (kvol * cig apart) -> filters[k, g] as [cig, cog].
  const Plan p{cog, cig, kvol * cig, cog, kvol, cig, groups * cig * cog, groups, cog * kvol * cig, cig * cog};
  run_bits(p, weight, filters, elem_size);
}

void filters_to_weight(const void* filters, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* weight,
                       int64_t elem_size) {
  // Matrix (k, g): filters[k, g] as [cig, cog] -> rows o of weight[g * cog + o, k, :].
  const Plan p{cig, cog, cog, kvol * cig, kvol, groups * cig * cog, cig, groups, cig * cog, cog * kvol * cig};
  run_bits(p, filters, weight, elem_size);
}

void transpose_matrices(const void* src, int64_t n, int64_t rows, int64_t cols, void* dst, int64_t elem_size) {
  const Plan p{rows, cols, cols, rows, n, rows * cols, rows * cols, 1, 0, 0};
  run_bits(p, src, dst, elem_size);
}

}  // namespace native
}  // namespace spconv
