// Element loads and arithmetic of the kernels that compute in FP32 (FP64 for double) without matrix cores:
// pooling and the int8 epilogue must equal the CPU route's bits, so their products are never contracted into
// an FMA (the CPU loops round the product and the sum separately; nvcc honours the _rn intrinsics, hipcc
// contracts unless told not to, g++ in the HIP CPU build runs with -ffp-contract=off). Grouped convolution
// sums with fused multiply-adds (fma_rn), as the CPU route's vector loops do.
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

// a * b + c rounded once: one FMA instruction on the GPU (two, a multiply and an add, with mul_add_rn).
__device__ __forceinline__ float fma_rn(float a, float b, float c) {
#if defined(SPCONV_CUDA)
  return __fmaf_rn(a, b, c);
#else
  return fmaf(a, b, c);
#endif
}
__device__ __forceinline__ double fma_rn(double a, double b, double c) {
#if defined(SPCONV_CUDA)
  return __fma_rn(a, b, c);
#else
  return fma(a, b, c);
#endif
}

// Single FP32 operations rounded to nearest even on their own (the int8 epilogue: never contracted, so a
// product followed by a sum rounds twice on every target, as the CPU route does).
__device__ __forceinline__ float mul_rn(float a, float b) {
#if defined(SPCONV_CUDA)
  return __fmul_rn(a, b);
#else
#pragma clang fp contract(off)
  return a * b;
#endif
}
__device__ __forceinline__ float add_rn(float a, float b) {
#if defined(SPCONV_CUDA)
  return __fadd_rn(a, b);
#else
#pragma clang fp contract(off)
  return a + b;
#endif
}
// nearbyint in the default rounding mode: ties to even (rintf exists on CUDA, HIP and the host).
__device__ __forceinline__ float round_even(float v) { return rintf(v); }

// int8 elements compared as floats (max pooling): exact, every int8 is a float.
__device__ __forceinline__ float ld(int8_t v) { return static_cast<float>(v); }

}  // namespace gpu
}  // namespace spconv
