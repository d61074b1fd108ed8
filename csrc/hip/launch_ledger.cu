// Counts the kernel launches of the HIP CPU test build (see launch_ledger.h). GPU builds compile nothing here:
// a counter on a real GPU would only count host-side calls, which profilers already show.
#include "hip_compat.h"

#if defined(SPCONV_HIP_CPU)
#include <atomic>

#include "launch_ledger.h"

namespace spconv {
namespace gpu {
namespace {

std::atomic<int64_t> launches{0};
std::atomic<int64_t> body_ns{0};

}  // namespace

void note_launch(int64_t ns) {
  launches.fetch_add(1, std::memory_order_relaxed);
  body_ns.fetch_add(ns, std::memory_order_relaxed);
}

LaunchLedger launch_ledger() {
  return {launches.load(std::memory_order_relaxed), body_ns.load(std::memory_order_relaxed)};
}

}  // namespace gpu
}  // namespace spconv
#endif
