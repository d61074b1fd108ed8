// Thread order of the HIP CPU test build (included by hip_compat.h under SPCONV_HIP_CPU; nothing elsewhere).
//
// The HIP CPU runtime runs a block's threads one after another between barriers, always in ascending thread id,
// so a missing barrier between a write by a low thread and a read (or atomic) by a higher one passes every test.
// The tests therefore also run the kernels in descending order (spconv_hip_cpu_set_descending, exported by the
// library for ctypes): the kernels see logical thread ids logical = N - 1 - physical over the block's N threads,
// so the highest logical thread runs first. Only one-dimensional blocks of whole wavefronts are reversed (every
// launch of the project uses 256 or 1 threads in x; the runtime orders the threads of other shapes in its own
// way): each wavefront then maps onto one wavefront with its lanes reversed, and the warp operations the kernels
// use are translated (a logical shuffle down is a physical shuffle up), so results keep their bits while every
// unsynchronised ordering between threads flips.
#pragma once

#include <atomic>
#include <cstdint>

namespace spconv {
namespace gpu {
namespace thread_order {

constexpr unsigned kWave = 64;  // the runtime's wavefront

// One flag per loaded library (an inline function's static is one object within the shared library).
inline std::atomic<bool>& descending_flag() {
  static std::atomic<bool> flag{false};
  return flag;
}

// True when this block's ids run in descending order.
inline bool reversed() {
  return descending_flag().load(std::memory_order_relaxed) && blockDim.y == 1 && blockDim.z == 1 &&
         blockDim.x % kWave == 0;
}

inline dim3 logical_thread() {
  const dim3 t(threadIdx.x, threadIdx.y, threadIdx.z);
  return reversed() ? dim3(blockDim.x - 1 - t.x, 0, 0) : t;
}

// threadIdx's shape: .x / .y / .z convert to the logical coordinate.
struct LogicalThreadIdx {
  struct X { operator std::uint32_t() const { return logical_thread().x; } } x;
  struct Y { operator std::uint32_t() const { return logical_thread().y; } } y;
  struct Z { operator std::uint32_t() const { return logical_thread().z; } } z;
};

}  // namespace thread_order
}  // namespace gpu
}  // namespace spconv

// From here on every kernel and emulator reads logical ids (the functions above keep the runtime's).
#define threadIdx (::spconv::gpu::thread_order::LogicalThreadIdx{})
