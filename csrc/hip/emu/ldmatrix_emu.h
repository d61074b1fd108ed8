// PTX ldmatrix.sync.aligned.m8n8.{x1,x2,x4}{,.trans}.shared.b16 for the HIP-CPU build (SPCONV_EMULATE_SM80).
// Never part of an nvcc or hipcc build (tc_sm80.h issues the real instruction there).
//
// Written from the PTX ISA, "ldmatrix": the warp loads N (1, 2, 4) 8x8 matrices of 16-bit elements; lanes
// 8i..8i+7 give the addresses of rows 0..7 of matrix i (16 contiguous bytes, 16-byte aligned; the addresses of
// lanes 8N..31 are not used). Lane l, g = l / 4, t = l % 4, receives in register i the two elements
//   M_i[g][2t], M_i[g][2t+1]          (low half first), or with .trans
//   M_i[2t][g], M_i[2t+1][g].
// Each lane reads the row it addresses when it executes the call, before the exchange: data another thread
// writes later (a missing barrier or cp.async wait) is not seen, as on the hardware it may not be.
// Lanes exchange rows through warp_exchange.h: every thread of the block makes the same calls.
#pragma once

#include <cstdint>
#include <cstring>

#include "warp_exchange.h"

namespace spconv_emu {

struct MatrixRow {
  uint16_t e[8];
};

template <int N>
inline void ldmatrix_m8n8(uint32_t (&r)[N], const void* row_address, bool trans) {
  static_assert(N == 1 || N == 2 || N == 4, ".x1, .x2 or .x4");
  __shared__ WarpExchange<MatrixRow> exchange;
  const int l = static_cast<int>(linear_thread() % kWarp);
  MatrixRow mine{};
  if (l < 8 * N) {
    if (reinterpret_cast<uintptr_t>(row_address) % 16 != 0) warp_fail("ldmatrix", "row address not 16-byte aligned");
    std::memcpy(mine.e, row_address, sizeof mine.e);
  }
  auto& warp = warp_publish(exchange, mine, "ldmatrix");
  const int g = l / 4, t = l % 4;
  for (int i = 0; i < N; ++i) {
    const MatrixRow* m = &warp.lane[8 * i];
    const uint16_t lo = trans ? m[2 * t].e[g] : m[g].e[2 * t];
    const uint16_t hi = trans ? m[2 * t + 1].e[g] : m[g].e[2 * t + 1];
    r[i] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
  }
  warp_release(warp);
}

}  // namespace spconv_emu
