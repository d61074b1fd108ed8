// Native convolution: per kernel offset, gather rows -> GEMM (ATen/BLAS) -> scatter-add rows
// (inputs with few channels go the direct route instead, see direct_conv.h).
// The pairs are bucketed by blocks of destination rows (output rows forward, input rows for dX), and one
// parallel pass runs over the blocks, each through all offsets in order: a block's rows stay in cache, no
// barrier separates the offsets, and every row sums its offsets' products in offset order. Chunks and blocks
// depend on the sizes only, never on the thread count, so results are bitwise reproducible.
#pragma once
#include <ATen/ATen.h>

namespace spconv {
namespace native {

// dst[scatter[p]] = sum over the pairs p writing that row of src[gather[p]] @ W_k (or @ W_k^T when
// transpose_w), zero for rows without pairs. src [n_src, c_src], weights [kvol, c_in, c_out], dst [n_dst,
// c_dst] contiguous and overwritten (each task zeroes its block's rows while they are in cache: no zero-fill
// pass over memory); float/double. mirrored: offset k's pairs are offset kvol - 1 - k's with gather and scatter
// swapped (a SubM map of odd kernel sizes; row_blocks.h), which spares copying the pairs whose scatter rows
// don't ascend.
void gather_gemm_scatter(const at::Tensor& src, const at::Tensor& weights, bool transpose_w,
                         const int32_t* gather, const int32_t* scatter, const int64_t* offsets, at::Tensor& dst,
                         bool mirrored = false);

// Backward of the above (transpose_w=false) in one pass over the pairs, dY gathered once per pair
// (dW summed per block of input rows, then over the blocks in order):
// dx[pair_in[p]] += dy[pair_out[p]] @ W_k^T and dw[k] = sum_p x[pair_in[p]]^T dy[pair_out[p]].
// dx [n_in, c_in] contiguous and dw [kvol, c_in, c_out] are overwritten.
void gather_gemm_scatter_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                                  const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets,
                                  at::Tensor& dx, at::Tensor& dw, bool mirrored = false);

}  // namespace native
}  // namespace spconv
