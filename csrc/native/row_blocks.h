// A kernel map's pairs bucketed by blocks of the rows of one side, for kernels that walk a block of rows at a
// time over all offsets (the row-block GEMMs, the row grouping of pairs_by_row.h).
#pragma once
#include <cstdint>
#include <vector>

#include "uninit_vector.h"

namespace spconv {
namespace native {

// The pairs bucketed by (block of key rows, offset): bucket (b, k) holds, in their original order, the pairs
// of offset k whose key row (the side written) lies in block b. Identity offsets are left out: they apply to
// each block's own rows directly. Where an offset's key rows already ascend (a SubM map's output side), its
// buckets are ranges of the pair lists themselves. In a mirrored map (offset k's pairs are offset kvol - 1 - k's
// with the sides swapped: a SubM map of odd kernel sizes), an offset whose key rows don't ascend takes the ranges
// of its mirror's list, sides swapped, where that list's other side ascends (a SubM map's input side, in dX). The
// other offsets' pairs are copied out, bucket by bucket.
struct RowBlocks {
  int64_t rows = 0, n_blocks = 0, kvol = 0;
  std::vector<int64_t> first, last;  // [n_blocks * kvol]: bucket (b, k) is pairs [first, last) of key / other
  UninitVector<int32_t> key_copy, other_copy;  // written whole by the copy pass
  const int32_t* key_src = nullptr;
  const int32_t* other_src = nullptr;
  std::vector<char> copied;   // [kvol]: offset k's buckets index the copies
  std::vector<char> swapped;  // [kvol]: offset k's buckets index its mirror's pairs, key and other swapped

  int64_t begin(int64_t b, int64_t k) const { return first[b * kvol + k]; }
  int64_t count(int64_t b, int64_t k) const { return last[b * kvol + k] - first[b * kvol + k]; }
  const int32_t* key(int64_t k) const { return copied[k] ? key_copy.data() : swapped[k] ? other_src : key_src; }
  const int32_t* other(int64_t k) const { return copied[k] ? other_copy.data() : swapped[k] ? key_src : other_src; }
  int64_t pairs(int64_t b) const {  // every non-identity pair of block b
    int64_t n = 0;
    for (int64_t k = 0; k < kvol; ++k) n += count(b, k);
    return n;
  }
};

// key / other: the two sides of the pairs (offset k's are [offsets[k], offsets[k + 1])); identity[k]: leave offset
// k out; the key rows lie in [0, n_rows), block_rows per block; mirrored: the map is (see RowBlocks; trusted, as
// the map's record says so). The offsets are checked in parallel when the map holds at least parallel_copy_pairs
// pairs, and those that need copies are copied in parallel when they hold that many (a parallel region costs a
// scheduler slice when a worker waits behind other processes).
constexpr int64_t kParallelCopyPairs = int64_t{1} << 18;
RowBlocks bucket_by_row_block(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                              const std::vector<char>& identity, int64_t n_rows, int64_t block_rows,
                              bool mirrored = false, int64_t parallel_copy_pairs = kParallelCopyPairs);

}  // namespace native
}  // namespace spconv
