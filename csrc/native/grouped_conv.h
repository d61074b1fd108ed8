// Grouped and depthwise sparse convolution on the CPU, output-stationary: each destination row sums its pairs'
// products (in kernel-offset order) and is written once, so there is no scatter and the bits don't depend on
// the thread count. A grouped layer does 1/groups of the arithmetic of a dense one for the same traffic, so
// it is memory-bound (a depthwise one entirely): streaming the rows beats staging them for a GEMM whose inner
// dimension would be Cin/groups (1 for depthwise).
//
// Filters are [kvol, G, cig, cog] (cig = Cin / G, cog = Cout / G): offset k, group g maps input channels
// [g*cig, (g+1)*cig) to output channels [g*cog, (g+1)*cog). groups = 1 is the dense [kvol, Cin, Cout].
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

namespace spconv {
namespace native {

// Where each destination row's pairs come from, in kernel-offset order:
//  * a neighbour table [rows, kvol] (entry = the other side's row, -1 = none; the fused route's table), or
//  * the pairs grouped by destination row (CSR: start [rows + 1], other and offset per pair; PairsByRow).
// Table entries are not trusted: one outside [-1, n_other) is skipped and reported.
struct GroupedRows {
  int64_t rows = 0, kvol = 0, n_other = 0;
  const int32_t* table = nullptr;
  const int64_t* start = nullptr;
  const int32_t* other = nullptr;
  const int32_t* offset = nullptr;
};

// y[r, g*cog:(g+1)*cog] = sum over row r's pairs (o, k) of x[o, g*cig:(g+1)*cig] @ w[k, g].
// x [n_other, G*cig], w [kvol, G, cig, cog] contiguous; y [rows, G*cog] (overwritten); float or double.
// Returns false when a table entry was out of range (the caller raises).
bool grouped_forward(const at::Tensor& x, const at::Tensor& w, const GroupedRows& rows, at::Tensor& y);

// The backward in one pass over the input rows (rows = inputs, other = outputs): each pair's dy row is read
// once for both products. dx[i] = sum over i's pairs (o, k) of dy[o] @ w[k]^T per group (wt = w transposed to
// [kvol, G, cog, cig]); dw[k] = sum over the pairs of x[i]^T dy[o] per group, summed per fixed block of rows
// and then over the blocks in order. x [rows, G*cig], dy [n_other, G*cog]; dx and dw are overwritten.
bool grouped_backward(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& dy, const GroupedRows& rows,
                      at::Tensor& dx, at::Tensor& dw);

}  // namespace native
}  // namespace spconv
