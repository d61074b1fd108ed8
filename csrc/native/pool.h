// Native pooling over a kernel map (pairs grouped by kernel offset, see schema.cpp).
// Each output (or input) row walks its pairs in offset order (pairs regrouped by that row), so every
// result, including which input receives a max-pool gradient, is independent of the thread count.
// num_in / num_out bound the pair rows (the glue has checked them).
#pragma once
#include <cstdint>

namespace spconv {
namespace native {

// out [num_out, C] is overwritten: spconv's max pool starts every output at 0, so the result is
// max(0, max over the window's active inputs).
template <typename T>
void maxpool_forward(const T* x, int64_t channels, int64_t num_out, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* out);

// din [num_in, C] zero on entry. For every (output, channel) the gradient goes to the input of the
// first kernel offset (window raster order, as torch's max_pool) whose value equals the output;
// none goes anywhere when the output is the clamp's 0 and no input equals it.
template <typename T>
void maxpool_backward(const T* x, const T* out, const T* dout, int64_t channels, int64_t num_in, int64_t num_out,
                      const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, int64_t kvol,
                      T* din);

// Mean over the active inputs of each window (0 where none). out is overwritten; count [num_out] gets the
// number of active inputs per output.
template <typename T>
void avgpool_forward(const T* x, int64_t channels, int64_t num_out, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* out, int32_t* count);

// din [num_in, C] zero on entry: din[i] += dout[o] / count[o] over the pairs.
template <typename T>
void avgpool_backward(const T* dout, const int32_t* count, int64_t channels, int64_t num_in,
                      const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, int64_t kvol,
                      T* din);

}  // namespace native
}  // namespace spconv
