// The HIP CPU test build's switch of thread order (hip_cpu_thread_order.h), for the tests through ctypes: not an
// op, so that no build's op schema carries it. Empty in nvcc and hipcc builds.
#include "hip_compat.h"

#if defined(SPCONV_HIP_CPU)
// Runs every later launch of this library with each block's threads in descending (true) or ascending order;
// returns the previous setting.
extern "C" __attribute__((visibility("default"))) bool spconv_hip_cpu_set_descending(bool descending) {
  return spconv::gpu::thread_order::descending_flag().exchange(descending);
}
#endif
