#include "pairs_by_row.h"

#include <algorithm>

namespace spconv {
namespace native {

// Serial on purpose: two streaming passes over the pairs cost less than the barriers of a parallel pass per
// offset (which stall whenever the machine is busy and a worker thread isn't scheduled).
PairsByRow group_pairs_by_row(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
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

int64_t max_pairs_per_row(const int32_t* key, int64_t num_pairs, int64_t rows) {
  std::vector<int32_t> count(rows, 0);
  int32_t most = 0;
  for (int64_t p = 0; p < num_pairs; ++p) most = std::max(most, ++count[key[p]]);
  return most;
}

}  // namespace native
}  // namespace spconv
