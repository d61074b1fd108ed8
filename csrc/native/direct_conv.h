// Sparse convolution without the gather/GEMM/scatter staging, for few input channels (the first layer of a
// network, C_in = 3 or 4): there the GEMM has K = C_in and the scatter-add of C_out-wide rows, once per pair,
// costs far more than the arithmetic. Instead each output row (input row for dX) sums its pairs' products in
// registers, in kernel-offset order, and is written once: reproducible bits for any thread count.
#pragma once
#include <ATen/ATen.h>

namespace spconv {
namespace native {

// Inputs with at most this many channels take the direct route.
constexpr int64_t kDirectMaxInChannels = 8;

// dst[pair_out[p]] = sum over the pairs p of row (in offset order) of x[pair_in[p]] @ W_k.
// x [n_in, c_in], weights [kvol, c_in, c_out] contiguous, dst [n_out, c_out] overwritten; float/double.
void direct_conv_forward(const at::Tensor& x, const at::Tensor& weights, const int32_t* pair_in,
                         const int32_t* pair_out, const int64_t* offsets, at::Tensor& dst);

// dx [n_in, c_in] (overwritten) = sum over the pairs of dy[pair_out[p]] @ W_k^T;
// dw [kvol, c_in, c_out] is overwritten with sum_p x[pair_in[p]]^T dy[pair_out[p]].
void direct_conv_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                          const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, at::Tensor& dx,
                          at::Tensor& dw);

}  // namespace native
}  // namespace spconv
