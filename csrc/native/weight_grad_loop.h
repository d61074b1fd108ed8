// The loop of the fused dW kernels, shared by the instruction sets: chunks of pairs (their x and dy rows stay in
// cache over all the tiles), then tiles of input channels. Each element's chain runs over the pairs in order, from
// zero (fresh) or its stored value, so every tiling gives the same bits.
#pragma once
#include <algorithm>
#include <cstdint>

#include "prefetch_rows.h"

namespace spconv {
namespace native {

// Pairs per dW chunk: about 32 KB of x and dy rows, which stay in L1 over the chunk's passes (64 channels: 64
// pairs), 64 to 256 pairs (docs/routes.md, "Measured choices of the CPU kernels").
inline int64_t weight_grad_chunk(int64_t cin, int64_t cout, int64_t elem_size) {
  return std::clamp<int64_t>((int64_t{32} << 10) / ((cin + cout) * elem_size), 64, 256);
}

// The dW loop's ahead(p0, n): the rows (x: cin of ldx, dy: cout of ldy) of pairs [p0, p0 + n) into L2.
template <typename T>
struct WeightGradAhead {
  const T *x;
  int64_t ldx, cin;
  const T* dy;
  int64_t ldy, cout;
  const int32_t *in, *out;
  inline __attribute__((always_inline)) void operator()(int64_t p0, int64_t n) const {  // see prefetch_rows
    prefetch_rows<2>(x, cin, in + p0, n, ldx);
    prefetch_rows<2>(dy, cout, out + p0, n, ldy);
  }
};

// tile(p0, n, c0, rows, fresh): pairs [p0, p0 + n), input channels [c0, c0 + rows), every output column.
// ahead(p0, n): request the x and dy rows of pairs [p0, p0 + n) into L2. Each pass over a chunk requests its share
// of the next chunk's rows, so that the first pass over a chunk does not wait on memory pair by pair.
template <typename T, typename Tile, typename Ahead>
void weight_grad_loop(int64_t cin, int64_t cout, int64_t m, bool accumulate, int64_t tile_rows, T* dw,
                      const Tile& tile, const Ahead& ahead) {
  if (m == 0) {
    if (!accumulate) std::fill(dw, dw + cin * cout, T(0));
    return;
  }
  const int64_t passes = (cin + tile_rows - 1) / tile_rows, chunk = weight_grad_chunk(cin, cout, sizeof(T));
  ahead(0, std::min(chunk, m));
  for (int64_t p0 = 0; p0 < m; p0 += chunk) {
    const int64_t n = std::min(chunk, m - p0);
    const int64_t next = std::min(chunk, m - p0 - n), share = (next + passes - 1) / passes;
    const bool fresh = p0 == 0 && !accumulate;
    for (int64_t c0 = 0, q = 0; c0 < cin; c0 += tile_rows, q += share) {
      if (q < next) ahead(p0 + n + q, std::min(share, next - q));
      tile(p0, n, c0, std::min(tile_rows, cin - c0), fresh);
    }
  }
}

}  // namespace native
}  // namespace spconv
