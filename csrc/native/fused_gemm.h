// Gather-GEMM-scatter in one pass for FP32 (and FP64 on AVX-512) on x86: y[scatter[p]] += x[gather[p]] @ w for the m pairs of one
// kernel offset, w [cin, cout] row-major. Register tiles of a few pairs x up to 64 output channels read the
// gathered rows straight into the multiply and add each tile into its destination rows once: no gather buffer,
// no second pass. Each output element sums its cin products in order, then is added to y: the bits depend on
// the sizes only (and on the instruction set: AVX-512 and AVX2 tile the columns alike, so they agree too).
#pragma once
#include <cstdint>

#include "simd.h"

namespace spconv {
namespace native {

// AVX-512 (cout a multiple of 16 floats or 8 doubles): tiles of 6 pairs x 4 vectors of channels (a narrower last
// pass: 8 pairs x 3 vectors, 12 x 2, 6 x 1).
void fused_gather_gemm_scatter_avx512(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const float* w, int64_t cout, float* y);
void fused_gather_gemm_scatter_avx512(const double* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const double* w, int64_t cout, double* y);
// AVX2 (cout a multiple of 8, float): tiles of 6 pairs x 16 channels (12 of the 16 registers accumulate).
void fused_gather_gemm_scatter_avx2(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                    int64_t m, const float* w, int64_t cout, float* y);

// The filter gradient of one offset in one pass over its pairs: dw [cin, cout] (row-major) = (accumulate ? dw :
// 0) + sum_p x[in[p]]^T dy[out[p]], the rows of x and dy ldx and ldy elements apart (>= cin, cout: a group's
// channels are a slice of the rows). Tiles of 6 input channels x 4 vectors of output channels stay in registers
// over chunks of 256 pairs; each element sums its pairs in order. AVX-512, cout a multiple of the vector.
void fused_weight_grad_avx512(const float* x, int64_t ldx, int64_t cin, const float* dy, int64_t ldy, int64_t cout,
                              const int32_t* in, const int32_t* out, int64_t m, bool accumulate, float* dw);
void fused_weight_grad_avx512(const double* x, int64_t ldx, int64_t cin, const double* dy, int64_t ldy,
                              int64_t cout, const int32_t* in, const int32_t* out, int64_t m, bool accumulate,
                              double* dw);
// AVX2 (float, cout a multiple of 8): tiles of 6 input channels x 16 output channels, the same chains (bits).
void fused_weight_grad_avx2(const float* x, int64_t ldx, int64_t cin, const float* dy, int64_t ldy, int64_t cout,
                            const int32_t* in, const int32_t* out, int64_t m, bool accumulate, float* dw);

// AVX2 dW kernel only up to this many output channels: wider, the vendor GEMM is faster (docs/routes.md,
// "Measured choices of the CPU kernels").
constexpr int64_t kAvx2MaxWeightGradCout = 64;

// Channels per 512-bit vector.
template <typename T>
constexpr int64_t kAvx512Lanes = 64 / static_cast<int64_t>(sizeof(T));

// True when this CPU has a dW kernel for the shape: float on AVX-512 or AVX2, double on AVX-512.
template <typename T>
inline bool fused_weight_grad_ok(int64_t cin, int64_t cout) {
  if (cin <= 0 || cout <= 0) return false;
  if (cpu_has_avx512f() && cout % kAvx512Lanes<T> == 0) return true;
  return sizeof(T) == sizeof(float) && cpu_has_avx2_fma() && cout % 8 == 0 && cout <= kAvx2MaxWeightGradCout;
}

// True when this CPU has a forward kernel for the shape: float on AVX-512 or AVX2, double on AVX-512.
template <typename T>
inline bool fused_gemm_ok(int64_t cin, int64_t cout) {
  if (cin <= 0 || cout <= 0) return false;
  if (cpu_has_avx512f() && cout % kAvx512Lanes<T> == 0) return true;
  return sizeof(T) == sizeof(float) && cpu_has_avx2_fma() && cout % 8 == 0;
}

inline void fused_gather_gemm_scatter(const float* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const float* w, int64_t cout, float* y) {
  if (cpu_has_avx512f() && cout % 16 == 0)
    fused_gather_gemm_scatter_avx512(x, cin, gather, scatter, m, w, cout, y);
  else
    fused_gather_gemm_scatter_avx2(x, cin, gather, scatter, m, w, cout, y);
}

inline void fused_weight_grad(const float* x, int64_t ldx, int64_t cin, const float* dy, int64_t ldy, int64_t cout,
                              const int32_t* in, const int32_t* out, int64_t m, bool accumulate, float* dw) {
  if (cpu_has_avx512f() && cout % 16 == 0)
    fused_weight_grad_avx512(x, ldx, cin, dy, ldy, cout, in, out, m, accumulate, dw);
  else
    fused_weight_grad_avx2(x, ldx, cin, dy, ldy, cout, in, out, m, accumulate, dw);
}

inline void fused_weight_grad(const double* x, int64_t ldx, int64_t cin, const double* dy, int64_t ldy,
                              int64_t cout, const int32_t* in, const int32_t* out, int64_t m, bool accumulate,
                              double* dw) {
  fused_weight_grad_avx512(x, ldx, cin, dy, ldy, cout, in, out, m, accumulate, dw);
}

inline void fused_gather_gemm_scatter(const double* x, int64_t cin, const int32_t* gather, const int32_t* scatter,
                                      int64_t m, const double* w, int64_t cout, double* y) {
  fused_gather_gemm_scatter_avx512(x, cin, gather, scatter, m, w, cout, y);
}

}  // namespace native
}  // namespace spconv
