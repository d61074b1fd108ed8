// Kernel-map generation for the native route: per kernel offset, the (input row, output row) pairs.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "spconv/coords.h"
#include "uninit_vector.h"

namespace spconv {
namespace native {

struct KernelMap {
  UninitVector<int32_t> out_indices;  // [num_out, 1 + ndim], only for non-subm
  int64_t num_out = 0;
  // table[r * kvol + k]: the partner row of row r through offset k, or -1.
  // Subm: rows are outputs, partners inputs. Regular/transposed: rows are inputs, partners outputs.
  std::unique_ptr<int32_t[]> table;  // uninitialised on allocation: the builders write every entry
  bool rows_are_outputs = false;
  // No row repeats within one offset (no two inputs share a coordinate): the GPU kernels' precondition.
  bool repeat_free = true;
};

// Submanifold: outputs are the inputs. Returns the row of the first duplicate coordinate, or -1.
int64_t build_subm_map(const int32_t* indices, int64_t n, const ConvGeometry& g, KernelMap& map);

// Regular (transpose=false) or transposed convolution: outputs are created in input-row order.
void build_conv_map(const int32_t* indices, int64_t n, const ConvGeometry& g, bool transpose, KernelMap& map);

// Compaction of the table into pairs grouped by offset, rows ascending within a group.
// count_pairs fills pair_offsets (kvol + 1 entries) and returns per-(row block, offset) counts,
// which compact_pairs consumes.
std::vector<int64_t> count_pairs(const KernelMap& map, int64_t num_rows, int64_t kvol, int64_t* pair_offsets);
void compact_pairs(const KernelMap& map, int64_t num_rows, int64_t kvol, const int64_t* pair_offsets,
                   std::vector<int64_t> block_counts, int32_t* pair_in, int32_t* pair_out);

}  // namespace native
}  // namespace spconv
