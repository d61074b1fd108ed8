// A diagnostic of the HIP CPU test build, in its diagnostics' namespace (debug_schema.cpp): the launch ledger
// (csrc/hip/launch_ledger.h), read by the benchmark's launch ledger and its tests. GPU builds register nothing.
#if defined(SPCONV_HIP_CPU)
#include <torch/library.h>

#include <vector>

#include "../../hip/launch_ledger.h"
#include "../op_library.h"

namespace {

// [kernel launches, nanoseconds their bodies ran], both since the library was loaded.
std::vector<int64_t> debug_launch_ledger() {
  const spconv::gpu::LaunchLedger l = spconv::gpu::launch_ledger();
  return {l.launches, l.body_ns};
}

}  // namespace

SPCONV_DEBUG_SCHEMA_FRAGMENT(m) { m.def("debug_launch_ledger() -> int[]", &debug_launch_ledger); }
#endif
