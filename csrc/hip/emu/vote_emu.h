// PTX vote.sync.any.pred (CUDA's __any_sync over a full warp) for the HIP-CPU build (SPCONV_EMULATE_SM80), where
// the runtime's own wavefront is 64 lanes wide and the emulated sm_80 warp 32. Never part of an nvcc or hipcc
// build (tc_sm80.h issues the real instruction there).
//
// Written from the PTX ISA, "vote": with the full member mask, every lane of the warp receives whether the
// predicate holds in any of its 32 lanes. Lanes exchange their predicates through warp_exchange.h: every
// thread of the block makes the same calls.
#pragma once

#include <cstdint>

#include "warp_exchange.h"

namespace spconv_emu {

inline bool vote_any(bool p) {
  __shared__ WarpExchange<uint8_t> exchange;
  auto& warp = warp_publish(exchange, static_cast<uint8_t>(p ? 1 : 0), "vote.any");
  bool any = false;
  for (int l = 0; l < kWarp; ++l) any = any || warp.lane[l] != 0;
  warp_release(warp);
  return any;
}

}  // namespace spconv_emu
