#include "row_blocks.h"

#include <ATen/Parallel.h>

#include <algorithm>

namespace spconv {
namespace native {

namespace {

bool ascends(const int32_t* v, int64_t n) {
  bool ok = true;
  for (int64_t p = 1; p < n; ++p) ok &= v[p - 1] < v[p];  // no early exit: a vectorisable pass
  return ok;
}

}  // namespace

RowBlocks bucket_by_row_block(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                              const std::vector<char>& identity, int64_t n_rows, int64_t block_rows, bool mirrored,
                              int64_t parallel_copy_pairs) {
  RowBlocks d;
  d.rows = block_rows;
  d.kvol = kvol;
  d.n_blocks = (n_rows + block_rows - 1) / block_rows;
  d.key_src = key;
  d.other_src = other;
  d.first.assign(d.n_blocks * kvol, 0);
  d.last.assign(d.n_blocks * kvol, 0);
  d.copied.assign(kvol, 0);
  d.swapped.assign(kvol, 0);
  // Each offset either ascends (its buckets are ranges of the pair list, found by binary search), or its mirror's
  // other side does (ranges of that list), or it is marked for copying. Offsets are independent, and the check
  // reads every pair: in parallel once the pairs are many.
  const int64_t grain = offsets[kvol] - offsets[0] >= parallel_copy_pairs ? 1 : kvol;
  at::parallel_for(0, kvol, grain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (identity[k]) continue;
      const int64_t n = offsets[k + 1] - offsets[k], m = kvol - 1 - k;
      int64_t start = offsets[k];
      const int32_t* kk = key + start;
      if (!ascends(kk, n)) {
        if (mirrored && offsets[m + 1] - offsets[m] == n && ascends(other + offsets[m], n)) {
          d.swapped[k] = 1;
          start = offsets[m];
          kk = other + start;
        } else {
          d.copied[k] = 1;
          continue;
        }
      }
      int64_t p = 0;
      for (int64_t b = 0; b < d.n_blocks; ++b) {
        d.first[b * kvol + k] = start + p;
        p = std::lower_bound(kk + p, kk + n, static_cast<int32_t>(std::min(n_rows, (b + 1) * block_rows))) - kk;
        d.last[b * kvol + k] = start + p;
      }
    }
  });
  int64_t copy_pairs = 0;
  for (int64_t k = 0; k < kvol; ++k)
    if (d.copied[k]) copy_pairs += offsets[k + 1] - offsets[k];
  if (copy_pairs == 0) return d;
  // Each offset writes only its own buckets: the copied offsets can run in parallel.
  const int64_t copy_grain = copy_pairs >= parallel_copy_pairs ? 1 : kvol;
  std::vector<int64_t> count(d.n_blocks * kvol, 0);
  at::parallel_for(0, kvol, copy_grain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k)
      if (d.copied[k])
        for (int64_t p = offsets[k]; p < offsets[k + 1]; ++p) ++count[key[p] / block_rows * kvol + k];
  });
  int64_t total = 0;  // the copies, bucket (b, k) after (b, k - 1)
  for (int64_t i = 0; i < d.n_blocks * kvol; ++i) {
    if (!d.copied[i % kvol]) continue;
    d.first[i] = d.last[i] = total;
    total += count[i];
  }
  d.key_copy.resize(total);
  d.other_copy.resize(total);
  at::parallel_for(0, kvol, copy_grain, [&](int64_t k0, int64_t k1) {
    for (int64_t k = k0; k < k1; ++k) {
      if (!d.copied[k]) continue;
      for (int64_t p = offsets[k]; p < offsets[k + 1]; ++p) {
        const int64_t slot = d.last[key[p] / block_rows * kvol + k]++;
        d.key_copy[slot] = key[p];
        d.other_copy[slot] = other[p];
      }
    }
  });
  return d;
}

}  // namespace native
}  // namespace spconv
