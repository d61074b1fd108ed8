// Gather-GEMM-scatter in one pass for FP32 on AVX-512 CPUs: y[scatter[p]] += x[gather[p]] @ w for the m pairs
// of one kernel offset, w [cin, cout] row-major. Register tiles of 6 pairs x 64 output channels read the
// gathered rows straight into the multiply and add each tile into its destination rows once: no gather buffer,
// no second pass. Each output element sums its cin products in order, then is added to y: the bits depend on
// the sizes only.
#pragma once
#include <cstdint>

namespace spconv {
namespace native {

// True when this CPU runs the kernel and the shape suits it (cout a multiple of 16).
bool fused_gemm_avx512_ok(int64_t cin, int64_t cout);

void fused_gather_gemm_scatter_avx512(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const float* w, int64_t cout, float* y);

}  // namespace native
}  // namespace spconv
