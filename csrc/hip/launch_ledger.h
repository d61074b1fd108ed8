// The launch ledger of the HIP CPU test build: how many kernels launch_kernel() (hip_compat.h) launched in
// this library and how long their bodies ran. Torch-free and GPU-header-free, for the diagnostics op
// (csrc/ops/gpu/debug_ledger.cpp). Not part of the GPU builds.
#pragma once
#include <cstdint>

namespace spconv {
namespace gpu {

struct LaunchLedger {
  int64_t launches;  // since the library was loaded
  int64_t body_ns;   // wall time from each launch to the end of its body (the runtime runs it at once)
};

LaunchLedger launch_ledger();

}  // namespace gpu
}  // namespace spconv
