#include "pairs_by_row.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "row_blocks.h"
#include "run_tasks.h"

namespace spconv {
namespace native {

namespace {

// Below this many pairs one thread groups them: two streaming passes cost less than the parallel regions
// (which stall whenever the machine is busy and a worker thread isn't scheduled).
constexpr int64_t kParallelPairs = int64_t{1} << 18;
// Rows per block of the parallel grouping: a block's row counters stay in L1.
constexpr int64_t kBlockRows = 2048;

PairsByRow group_serial(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                        int64_t rows) {
  PairsByRow g;
  const int64_t n = offsets[kvol];
  g.start.assign(rows + 1, 0);
  int64_t* start = g.start.data();
  for (int64_t p = 0; p < n; ++p) ++start[key[p] + 1];
  for (int64_t r = 0; r < rows; ++r) start[r + 1] += start[r];
  // Pairs come grouped by offset, offsets in order: appending them in turn keeps each row's in offset order.
  std::vector<int64_t> cursor(g.start.begin(), g.start.end() - 1);
  int64_t* cur = cursor.data();
  g.other.resize(n);
  g.offset.resize(n);
  int32_t* oth = g.other.data();
  int32_t* off = g.offset.data();
  for (int64_t k = 0; k < kvol; ++k)
    for (int64_t p = offsets[k]; p < offsets[k + 1]; ++p) {
      const int64_t slot = cur[key[p]]++;
      oth[slot] = other[p];
      off[slot] = static_cast<int32_t>(k);
    }
  return g;
}

// The same grouping over blocks of rows in parallel: the pairs bucketed by (block, offset) in their order, then
// each block counts and places its rows' pairs, offsets in turn. Every row's pairs come out in the serial
// order, so the result is the serial one whatever the thread count.
PairsByRow group_by_blocks(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                           int64_t rows) {
  const RowBlocks blocks = bucket_by_row_block(key, other, offsets, kvol, std::vector<char>(kvol, 0), rows, kBlockRows,
                                               /*mirrored=*/false, /*parallel_copy_pairs=*/0);
  std::vector<int64_t> base(blocks.n_blocks + 1, 0);  // the block's first slot
  for (int64_t b = 0; b < blocks.n_blocks; ++b) base[b + 1] = base[b] + blocks.pairs(b);
  PairsByRow g;
  g.start.resize(rows + 1);
  g.other.resize(base.back());
  g.offset.resize(base.back());
  g.start[rows] = base.back();
  run_tasks(blocks.n_blocks, [&] {
    return [&, cur = std::vector<int64_t>(kBlockRows)](int64_t b) mutable {
      const int64_t r0 = b * kBlockRows, n = std::min(rows, r0 + kBlockRows) - r0;
      std::fill(cur.begin(), cur.begin() + n, 0);
      for (int64_t k = 0; k < kvol; ++k) {
        const int32_t* kk = blocks.key(k) + blocks.begin(b, k);
        for (int64_t p = 0, c = blocks.count(b, k); p < c; ++p) ++cur[kk[p] - r0];
      }
      int64_t slot = base[b];
      for (int64_t r = 0; r < n; ++r) {  // counts -> each row's first slot
        g.start[r0 + r] = slot;
        slot += cur[r];
        cur[r] = g.start[r0 + r];
      }
      for (int64_t k = 0; k < kvol; ++k) {
        const int32_t* kk = blocks.key(k) + blocks.begin(b, k);
        const int32_t* oo = blocks.other(k) + blocks.begin(b, k);
        for (int64_t p = 0, c = blocks.count(b, k); p < c; ++p) {
          const int64_t at = cur[kk[p] - r0]++;
          g.other[at] = oo[p];
          g.offset[at] = static_cast<int32_t>(k);
        }
      }
    };
  });
  return g;
}

}  // namespace

PairsByRow group_pairs_by_row(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                              int64_t rows) {
  if (offsets[kvol] < kParallelPairs || at::get_num_threads() < 2) return group_serial(key, other, offsets, kvol, rows);
  return group_by_blocks(key, other, offsets, kvol, rows);
}

int64_t max_pairs_per_row(const int32_t* key, int64_t num_pairs, int64_t rows) {
  std::vector<int32_t> count(rows, 0);
  int32_t most = 0;
  for (int64_t p = 0; p < num_pairs; ++p) most = std::max(most, ++count[key[p]]);
  return most;
}

}  // namespace native
}  // namespace spconv
