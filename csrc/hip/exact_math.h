// Element loads and arithmetic of the kernels whose results must equal the CPU route's bit for bit (pooling,
// grouped convolution): values are computed in FP32 (FP64 for double) and products are never contracted into
// an FMA, since the CPU loops round the product and the sum separately. nvcc honours the _rn intrinsics;
// hipcc contracts unless told not to (g++ in the HIP CPU build: -ffp-contract=off).
#pragma once
#include "hip_compat.h"

namespace spconv {
namespace gpu {

template <typename T> struct AccOf { using type = float; };
template <> struct AccOf<double> { using type = double; };

__device__ __forceinline__ float ld(float v) { return v; }
__device__ __forceinline__ float ld(__half v) { return __half2float(v); }
__device__ __forceinline__ float ld(bf16_t v) { return bf16_to_float(v); }
__device__ __forceinline__ double ld(double v) { return v; }

// a * b + c rounded twice.
__device__ __forceinline__ float mul_add_rn(float a, float b, float c) {
#if defined(SPCONV_CUDA)
  return __fadd_rn(__fmul_rn(a, b), c);
#else
#pragma clang fp contract(off)
  return a * b + c;
#endif
}
__device__ __forceinline__ double mul_add_rn(double a, double b, double c) {
#if defined(SPCONV_CUDA)
  return __dadd_rn(__dmul_rn(a, b), c);
#else
#pragma clang fp contract(off)
  return a * b + c;
#endif
}

}  // namespace gpu
}  // namespace spconv
