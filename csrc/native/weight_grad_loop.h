// The loop of the fused dW kernels, shared by the instruction sets: chunks of pairs (their x and dy rows stay in
// L2 over all the tiles), then tiles of input channels. Each element's chain runs over the pairs in order, from
// zero (fresh) or its stored value, so every tiling gives the same bits.
#pragma once
#include <algorithm>
#include <cstdint>

namespace spconv {
namespace native {

constexpr int64_t kWeightGradChunk = 256;  // pairs per dW pass

// tile(p0, n, c0, rows, fresh): pairs [p0, p0 + n), input channels [c0, c0 + rows), every output column.
template <typename T, typename Tile>
void weight_grad_loop(int64_t cin, int64_t cout, int64_t m, bool accumulate, int64_t tile_rows, T* dw,
                      const Tile& tile) {
  if (m == 0) {
    if (!accumulate) std::fill(dw, dw + cin * cout, T(0));
    return;
  }
  for (int64_t p0 = 0; p0 < m; p0 += kWeightGradChunk) {
    const int64_t n = std::min(kWeightGradChunk, m - p0);
    const bool fresh = p0 == 0 && !accumulate;
    for (int64_t c0 = 0; c0 < cin; c0 += tile_rows) tile(p0, n, c0, std::min(tile_rows, cin - c0), fresh);
  }
}

}  // namespace native
}  // namespace spconv
