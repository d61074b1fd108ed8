// Packed int8 dot product of the int8 kernels: acc + sum over the 4 bytes i of a.byte[i] * b.byte[i], all signed,
// exact in int32 (the glue bounds the number of products). One instruction where the device target has it:
//  * AMD gfx906 / gfx908 / gfx90a / gfx94x: v_dot4_i32_i8 (__builtin_amdgcn_sdot4, no clamp);
//  * NVIDIA sm_61 and later: dp4a (__dp4a);
//  * anything else (other AMD targets, the HIP CPU runtime): four products in plain C, the same integers.
// SPCONV_INT8_DOT names the dot product compiled in (1 sdot4, 2 dp4a, 0 plain C).
// Matrix cores (SPCONV_INT8_MFMA, where hip_compat.h sets SPCONV_DEVICE_MFMA): 1 v_mfma_i32_16x16x16i8 (gfx90a,
// and the emulated MFMA of the HIP CPU build), 2 v_mfma_i32_16x16x32_i8 (gfx94x, which dropped the former).
#pragma once
#include "hip_compat.h"

// NVIDIA integer MMA (SPCONV_INT8_MMA, where hip_compat.h sets SPCONV_DEVICE_WMMA: sm_80 and later, and the
// emulated WMMA of the HIP CPU build): mma.sync m16n8k32 s8 (mma_s8_16x8x32 below).
#if defined(SPCONV_DEVICE_MFMA) && (defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define SPCONV_INT8_MFMA 2
#elif defined(SPCONV_DEVICE_MFMA)
#define SPCONV_INT8_MFMA 1
#elif defined(SPCONV_DEVICE_WMMA)
#define SPCONV_INT8_MMA 1
#if defined(SPCONV_HIP_CPU)
#include "emu/mma_s8_emu.h"
#endif
#endif

#if defined(SPCONV_HIP) && (defined(__gfx906__) || defined(__gfx908__) || defined(__gfx90a__) || \
                            defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define SPCONV_INT8_DOT 1
#elif defined(SPCONV_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 610
#define SPCONV_INT8_DOT 2
#else
#define SPCONV_INT8_DOT 0
#endif

namespace spconv {
namespace gpu {

// The plain-C body (also the reference of the one-instruction bodies): bytes sign-extended, products exact.
__device__ __forceinline__ int32_t dot4_i8_c(int32_t a, int32_t b, int32_t acc) {
  for (int i = 0; i < 4; ++i) {
    const int32_t ai = static_cast<int8_t>(static_cast<uint32_t>(a) >> (8 * i));
    const int32_t bi = static_cast<int8_t>(static_cast<uint32_t>(b) >> (8 * i));
    acc += ai * bi;
  }
  return acc;
}

__device__ __forceinline__ int32_t dot4_i8(int32_t a, int32_t b, int32_t acc) {
#if SPCONV_INT8_DOT == 1
  return __builtin_amdgcn_sdot4(a, b, acc, false);
#elif SPCONV_INT8_DOT == 2
  return __dp4a(a, b, acc);
#else
  return dot4_i8_c(a, b, acc);
#endif
}

#if defined(SPCONV_INT8_MMA)
// c += A (16 x 32, row) * B (32 x 8, col), int8 operands and int32 accumulators in the PTX fragment layout of
// mma.m16n8k32 (lane l, g = l / 4, t = l % 4): a = A[g][4t..], A[g + 8][4t..], A[g][16 + 4t..], A[g + 8][16 + 4t..];
// b = B[4t..][g], B[16 + 4t..][g]; c = C[g][2t], C[g][2t + 1], C[g + 8][2t], C[g + 8][2t + 1].
__device__ __forceinline__ void mma_s8_16x8x32(const uint32_t (&a)[4], const uint32_t (&b)[2], int32_t (&c)[4]) {
#if defined(SPCONV_HIP_CPU)
  spconv_emu::mma_m16n8k32_s8(a, b, c);
#else
  asm volatile(
      "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+r"(c[0]), "+r"(c[1]), "+r"(c[2]), "+r"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
#endif

}  // namespace gpu
}  // namespace spconv
