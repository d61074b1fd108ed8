// __builtin_amdgcn_mfma_f32_16x16x16f16 / _16x16x16bf16_1k / _i32_16x16x16i8 for the HIP-CPU build (host compiler + HIP CPU
// runtime), so that the MFMA bodies of fused_conv.cu run in tests without an AMD GPU. Included by
// hip_compat.h when SPCONV_EMULATE_MFMA is set; never part of a hipcc or nvcc build.
//
// v_mfma_f32_16x16x16f16 and v_mfma_f32_16x16x16bf16_1k (CDNA2 / CDNA3 ISA, wave64) compute D = A * B + C
// for a 16x16x16 tile spread over the 64 lanes of a wavefront. Lane l (i < 4, vector element i):
//   A[l % 16][4 * (l / 16) + i],  B[4 * (l / 16) + i][l % 16],  C and D [4 * (l / 16) + i][l % 16].
// v_mfma_i32_16x16x16i8 (CDNA2, wave64) has the same lane layout with 4 int8 packed in one 32-bit register per
// lane (element i in byte i) and an int32 accumulator.
// Source: AMD Matrix Instruction Calculator (github.com/ROCm/amd_matrix_instruction_calculator),
// --matrix-layout for A, B and D of both instructions on cdna2 and cdna3 (the same for every lane).
//
// Emulation: each lane writes its operands to a per-wavefront scratch tile in block-shared storage,
// __syncthreads(), each lane computes its own 4 elements of D, __syncthreads(). Requirements (checked,
// abort with a message):
//  * every thread of the block reaches each call together: HIP-CPU's barrier is block-wide, so the call
//    must be in block-uniform control flow, with blocks of whole wavefronts (all 64 lanes of each wave);
//  * cbsz = abid = blgp = 0 (no broadcast / lane-group swizzle; those modifiers are not emulated).
// Arithmetic: products of fp16/bf16 values are exact in fp32; the 16 products of an element are added to C
// one at a time in k order, each add rounded to nearest even in fp32 (FMA contraction cannot change it).
// The hardware's internal order and rounding of that sum are not documented and not reproduced; nor are
// its denormal modes (subnormals are kept here) or NaN payloads. int8: the products and their int32 sum are exact
// (the callers keep it in range), so the order does not matter.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

// The operand vectors as clang spells them with ext_vector_type; the host compiler's vector_size types have
// the same size, element access and brace initialisation, and are the types fused_conv.cu's typedefs name.
typedef _Float16 spconv_emu_half4 __attribute__((vector_size(8)));
typedef short spconv_emu_short4 __attribute__((vector_size(8)));
typedef float spconv_emu_float4 __attribute__((vector_size(16)));
typedef int spconv_emu_int4 __attribute__((vector_size(16)));

namespace spconv_emu {

constexpr int kWave = 64;
constexpr int kMaxWaves = 1024 / kWave;

[[noreturn]] inline void mfma_fail(const char* what) {
  std::fprintf(stderr, "mfma emulation: %s\n", what);
  std::abort();
}

struct MfmaWave {
  float a[16][16], b[16][16];
  int arrived, done;  // lanes of this wave in the current call
};

inline spconv_emu_float4 mfma_16x16x16(const float (&av)[4], const float (&bv)[4], spconv_emu_float4 c, int cbsz,
                                       int abid, int blgp) {
  __shared__ MfmaWave scratch[kMaxWaves];
  if (cbsz != 0 || abid != 0 || blgp != 0) mfma_fail("cbsz, abid and blgp must be 0");
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int wave = static_cast<int>(linear / kWave), lane = static_cast<int>(linear % kWave);
  const int row = lane % 16, quad = lane / 16;
  MfmaWave& w = scratch[wave];
  for (int i = 0; i < 4; ++i) {
    w.a[row][4 * quad + i] = av[i];
    w.b[4 * quad + i][row] = bv[i];
  }
  ++w.arrived;
  __syncthreads();
  if (w.arrived != kWave) mfma_fail("all 64 lanes of a wavefront must execute the call together");
  spconv_emu_float4 d;
  for (int i = 0; i < 4; ++i) {
    const int m = 4 * quad + i;
    float s = c[i];
    for (int k = 0; k < 16; ++k) s += w.a[m][k] * w.b[k][row];
    d[i] = s;
  }
  if (++w.done == kWave) w.arrived = w.done = 0;  // the last reader resets; no lane writes before the barrier
  __syncthreads();
  return d;
}

struct MfmaWaveI8 {
  int32_t a[16][16], b[16][16];
  int arrived, done;
};

inline spconv_emu_int4 mfma_16x16x16_i8(int av, int bv, spconv_emu_int4 c, int cbsz, int abid, int blgp) {
  __shared__ MfmaWaveI8 scratch[kMaxWaves];
  if (cbsz != 0 || abid != 0 || blgp != 0) mfma_fail("cbsz, abid and blgp must be 0");
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int wave = static_cast<int>(linear / kWave), lane = static_cast<int>(linear % kWave);
  const int row = lane % 16, quad = lane / 16;
  MfmaWaveI8& w = scratch[wave];
  for (int i = 0; i < 4; ++i) {
    w.a[row][4 * quad + i] = static_cast<int8_t>(static_cast<uint32_t>(av) >> (8 * i));
    w.b[4 * quad + i][row] = static_cast<int8_t>(static_cast<uint32_t>(bv) >> (8 * i));
  }
  ++w.arrived;
  __syncthreads();
  if (w.arrived != kWave) mfma_fail("all 64 lanes of a wavefront must execute the call together");
  spconv_emu_int4 d;
  for (int i = 0; i < 4; ++i) {
    const int m = 4 * quad + i;
    int32_t s = c[i];
    for (int k = 0; k < 16; ++k) s += w.a[m][k] * w.b[k][row];
    d[i] = s;
  }
  if (++w.done == kWave) w.arrived = w.done = 0;
  __syncthreads();
  return d;
}

inline float bf16_bits_to_float(short v) {
  const uint32_t u = static_cast<uint32_t>(static_cast<uint16_t>(v)) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

}  // namespace spconv_emu

inline spconv_emu_float4 __builtin_amdgcn_mfma_f32_16x16x16f16(spconv_emu_half4 a, spconv_emu_half4 b,
                                                               spconv_emu_float4 c, int cbsz, int abid, int blgp) {
  float av[4], bv[4];
  for (int i = 0; i < 4; ++i) {
    av[i] = static_cast<float>(a[i]);
    bv[i] = static_cast<float>(b[i]);
  }
  return spconv_emu::mfma_16x16x16(av, bv, c, cbsz, abid, blgp);
}

inline spconv_emu_float4 __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(spconv_emu_short4 a, spconv_emu_short4 b,
                                                                   spconv_emu_float4 c, int cbsz, int abid,
                                                                   int blgp) {
  float av[4], bv[4];
  for (int i = 0; i < 4; ++i) {
    av[i] = spconv_emu::bf16_bits_to_float(a[i]);
    bv[i] = spconv_emu::bf16_bits_to_float(b[i]);
  }
  return spconv_emu::mfma_16x16x16(av, bv, c, cbsz, abid, blgp);
}

inline spconv_emu_int4 __builtin_amdgcn_mfma_i32_16x16x16i8(int a, int b, spconv_emu_int4 c, int cbsz, int abid,
                                                             int blgp) {
  return spconv_emu::mfma_16x16x16_i8(a, b, c, cbsz, abid, blgp);
}
