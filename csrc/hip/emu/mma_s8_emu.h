// PTX mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32 for the HIP-CPU build, so that the NVIDIA integer MMA
// body of quantized_conv.cu runs in tests without an NVIDIA GPU. Included by int8_dot.h when SPCONV_EMULATE_WMMA
// is set; never part of an nvcc or hipcc build.
//
// D = A * B + C for a 16 x 32 (row) times 32 x 8 (col) int8 tile over the 32 lanes of a warp, written from the
// PTX ISA, "Matrix Fragments for mma.m16n8k32" (.s8). Lane l, g = l / 4, t = l % 4; element e of a register's
// 4 bytes is byte e:
//   A: a[0] = A[g][4t + e], a[1] = A[g + 8][4t + e], a[2] = A[g][16 + 4t + e], a[3] = A[g + 8][16 + 4t + e];
//   B: b[0] = B[4t + e][g], b[1] = B[16 + 4t + e][g];
//   C, D (int32): c[0], c[1] = C[g][2t], C[g][2t + 1]; c[2], c[3] = C[g + 8][2t], C[g + 8][2t + 1].
// Warps are 32 consecutive linear thread ids, as on NVIDIA (not HIP-CPU's 64-wide wavefront).
// Emulation: each lane writes its operands to a per-warp scratch tile in block-shared storage, __syncthreads(),
// each lane computes its own 4 elements, __syncthreads(); so every thread of the block must reach each call
// together (block-uniform control flow, whole warps; checked, abort with a message). The int32 sums are exact
// (the callers keep them in range), so the order is irrelevant; .satfinite is not emulated.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace spconv_emu {

struct MmaWarpS8 {
  int32_t a[16][32], b[32][8];
  int arrived, done;
};

[[noreturn]] inline void mma_s8_fail(const char* what) {
  std::fprintf(stderr, "mma s8 emulation: %s\n", what);
  std::abort();
}

inline int32_t byte_of(uint32_t word, int e) { return static_cast<int8_t>(word >> (8 * e)); }

inline void mma_m16n8k32_s8(const uint32_t (&a)[4], const uint32_t (&b)[2], int32_t (&c)[4]) {
  constexpr int kWarp = 32;
  __shared__ MmaWarpS8 scratch[1024 / kWarp];
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int warp = static_cast<int>(linear / kWarp), lane = static_cast<int>(linear % kWarp);
  const int g = lane / 4, t = lane % 4;
  MmaWarpS8& w = scratch[warp];
  for (int e = 0; e < 4; ++e) {
    w.a[g][4 * t + e] = byte_of(a[0], e);
    w.a[g + 8][4 * t + e] = byte_of(a[1], e);
    w.a[g][16 + 4 * t + e] = byte_of(a[2], e);
    w.a[g + 8][16 + 4 * t + e] = byte_of(a[3], e);
    w.b[4 * t + e][g] = byte_of(b[0], e);
    w.b[16 + 4 * t + e][g] = byte_of(b[1], e);
  }
  ++w.arrived;
  __syncthreads();
  if (w.arrived != kWarp) mma_s8_fail("all 32 lanes of a warp must execute the call together");
  int32_t d[4];
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    int32_t s = c[i];
    for (int k = 0; k < 32; ++k) s += w.a[row][k] * w.b[k][col];
    d[i] = s;
  }
  if (++w.done == kWarp) w.arrived = w.done = 0;  // the last reader resets; no lane writes before the barrier
  __syncthreads();
  for (int i = 0; i < 4; ++i) c[i] = d[i];
}

}  // namespace spconv_emu
