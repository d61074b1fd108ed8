// Cross-lane exchange for the emulated warp-collective PTX instructions (mma.sync, ldmatrix) on the HIP-CPU
// runtime, where each GPU thread is a fiber and a fiber runs alone from one __syncthreads() to the next.
//
// A call publishes the lane's part into a per-warp slot of block-shared storage, passes one block barrier, and
// reads what it needs from the other lanes' parts. Slots alternate between two buffers per call (the parity is
// kept per thread): a lane may write the next call's slot before the others have read this call's, but not
// the one after, because that needs the next barrier, which every lane reaches only after its read.
// Hence every thread of the block must make the same sequence of calls (block-uniform control flow, whole
// warps of 32 consecutive linear thread ids): checked, abort with a message.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>

namespace spconv_emu {

constexpr int kWarp = 32;
constexpr int kMaxBlockThreads = 1024;

[[noreturn]] inline void warp_fail(const char* who, const char* what) {
  std::fprintf(stderr, "%s emulation: %s\n", who, what);
  std::abort();
}

inline unsigned linear_thread() { return threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z); }

// Slot payload type P per lane; one exchange object per instruction kind (its own storage).
template <typename P>
struct WarpExchange {
  struct Buffer {
    P lane[kWarp];
    int arrived, done;
  };
  Buffer buf[kMaxBlockThreads / kWarp][2];
  uint8_t parity[kMaxBlockThreads];
};

// Publishes `mine`, waits for the block, checks the warp arrived whole, returns the warp's published parts.
// `release` must be called by each lane after its last read of them.
template <typename P>
inline typename WarpExchange<P>::Buffer& warp_publish(WarpExchange<P>& x, const P& mine, const char* who) {
  const unsigned t = linear_thread();
  if (blockDim.x * blockDim.y * blockDim.z > unsigned(kMaxBlockThreads)) warp_fail(who, "block too large");
  if ((blockDim.x * blockDim.y * blockDim.z) % kWarp != 0) warp_fail(who, "block not a whole number of warps");
  auto& b = x.buf[t / kWarp][x.parity[t]];
  x.parity[t] ^= 1u;
  b.lane[t % kWarp] = mine;
  ++b.arrived;
  __syncthreads();
  if (b.arrived != kWarp) warp_fail(who, "all 32 lanes of a warp must execute the call together");
  return b;
}

template <typename B>
inline void warp_release(B& b) {
  if (++b.done == kWarp) b.arrived = b.done = 0;  // the last reader resets; rewritten only after the next barrier
}

}  // namespace spconv_emu
