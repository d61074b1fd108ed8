// A kernel map regrouped by the rows of one side (CSR), for kernels that walk all pairs of one output
// (or input) row at once instead of one kernel offset at a time.
#pragma once
#include <cstdint>
#include <vector>

#include "uninit_vector.h"

namespace spconv {
namespace native {

// Row r's pairs are entries [start[r], start[r + 1]), in kernel-offset order (the order the per-offset
// kernels apply them in), so a per-row accumulation is reproducible whatever the thread count.
// (Uninitialised on resize: the grouping writes every entry, in parallel for large maps.)
struct PairsByRow {
  UninitVector<int64_t> start;   // [rows + 1]
  UninitVector<int32_t> other;   // the pair's row on the other side
  UninitVector<int32_t> offset;  // the pair's kernel offset
};

// Groups the pairs by key[p] (pair_in or pair_out) in [0, rows); other is the opposite side's array.
PairsByRow group_pairs_by_row(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                              int64_t rows);

// The largest number of pairs any row in [0, rows) of key appears in.
int64_t max_pairs_per_row(const int32_t* key, int64_t num_pairs, int64_t rows);

}  // namespace native
}  // namespace spconv
