#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>

namespace spconv {
namespace ops {
// cpu_fma_peak_loop: the FLOPs of `iters` steps of the FMA chains on each intra-op thread (native/fma_peak.h).
int64_t cpu_fma_peak_loop(int64_t iters, c10::ScalarType dtype);
}  // namespace ops
}  // namespace spconv
