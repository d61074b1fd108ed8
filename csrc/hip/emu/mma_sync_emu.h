// PTX mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 for the HIP-CPU build (SPCONV_EMULATE_SM80),
// so that the sm_80 tensor-core body of fused_conv.cu runs in tests without an NVIDIA GPU. Never part of an
// nvcc or hipcc build (tc_sm80.h issues the real instruction there).
//
// D = A * B + C, A 16 x 16 (row), B 16 x 8 (col), C and D 16 x 8 fp32, over the 32 lanes of a warp, written
// from the PTX ISA, "Matrix Fragments for mma.m16n8k16" (floating point). Lane l, g = l / 4, t = l % 4; a
// .b32 register holds two 16-bit elements, the first in its low half:
//   A: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1], a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
//   B: b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//   C, D: c[0], c[1] = C[g][2t, 2t+1]; c[2], c[3] = C[g+8][2t, 2t+1].
// The order and rounding of the K-sum inside the instruction are not documented. Here, as in the WMMA emulator,
// the 16 products are added to the accumulator one at a time in k order, each as one fused multiply-add rounded
// to nearest even: the SIMT body's sequence of fmaf over k, bit for bit. (A product of two fp16 values, or of
// bf16 values within fp32's range, is exact, so this equals an exact product followed by a rounded add.) Subnormals are kept; NaN and Inf follow IEEE.
// Lanes exchange their registers through warp_exchange.h: every thread of the block makes the same calls.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "warp_exchange.h"

namespace spconv_emu {

inline float f16_bits_to_float(uint16_t bits) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu, man = bits & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float bf16_bits_to_float(uint16_t bits) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct MmaLaneRegs {
  uint32_t a[4], b[2];
};

inline uint16_t half_of(uint32_t reg, int h) { return static_cast<uint16_t>(reg >> (16 * h)); }

// bf16 selects the element type of A and B; c holds C on entry and D on return.
inline void mma_m16n8k16(const uint32_t (&a)[4], const uint32_t (&b)[2], float (&c)[4], bool bf16) {
  __shared__ WarpExchange<MmaLaneRegs> exchange;
  MmaLaneRegs mine;
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  for (int i = 0; i < 2; ++i) mine.b[i] = b[i];
  auto& warp = warp_publish(exchange, mine, "mma.sync m16n8k16");
  // The whole tiles from every lane's registers, by the documented layout.
  uint16_t ta[16][16], tb[16][8];
  for (int l = 0; l < kWarp; ++l) {
    const int g = l / 4, t = l % 4;
    const MmaLaneRegs& r = warp.lane[l];
    for (int h = 0; h < 2; ++h) {
      ta[g][2 * t + h] = half_of(r.a[0], h);
      ta[g + 8][2 * t + h] = half_of(r.a[1], h);
      ta[g][2 * t + 8 + h] = half_of(r.a[2], h);
      ta[g + 8][2 * t + 8 + h] = half_of(r.a[3], h);
      tb[2 * t + h][g] = half_of(r.b[0], h);
      tb[2 * t + 8 + h][g] = half_of(r.b[1], h);
    }
  }
  warp_release(warp);
  const int l = static_cast<int>(linear_thread() % kWarp), g = l / 4, t = l % 4;
  for (int i = 0; i < 4; ++i) {
    const int row = g + 8 * (i / 2), col = 2 * t + i % 2;
    float s = c[i];
    for (int k = 0; k < 16; ++k) {
      const float x = bf16 ? bf16_bits_to_float(ta[row][k]) : f16_bits_to_float(ta[row][k]);
      const float y = bf16 ? bf16_bits_to_float(tb[k][col]) : f16_bits_to_float(tb[k][col]);
      s = std::fma(x, y, s);
    }
    c[i] = s;
  }
}

}  // namespace spconv_emu
