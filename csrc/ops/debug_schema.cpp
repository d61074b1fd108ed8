// The schema of the diagnostics: counters, budgets and benchmark loops that tests, benchmarks and tools call and
// a model never does. They register into "<namespace>_debug" (spconv_debug; the HIP CPU test build's variants
// each their own), apart from the user's operators (schema.cpp).
#include <torch/library.h>

#include "checks.h"
#include "op_library.h"
#include "output_cache.h"
#if !defined(SPCONV_HIP_CPU)
#include "cpu/fma_peak_op.h"
#include "cpu/parallel_region_op.h"
#endif

SPCONV_DEBUG_SCHEMA(m) {
  // Device->host copies this library's op glue made since it was loaded (tests of the GPU path's syncs).
  m.def("host_copy_count() -> int", &spconv::ops::host_copy_count);
  // The cache of large CPU op outputs (output_cache.h): [cached bytes, cached blocks, hits, misses, capacity
  // bytes].
  m.def("cpu_output_cache_info() -> int[]", &spconv::ops::output_cache_info);
#if !defined(SPCONV_HIP_CPU)  // the HIP CPU test build holds the GPU code only
  // The FLOPs of `iters` steps of independent FMA chains on each intra-op thread, on the widest vectors the CPU
  // kernels use (float32 or float64 lanes): timed by the benchmark as the machine's FMA peak.
  m.def("cpu_fma_peak_loop(int iters, ScalarType dtype) -> int", &spconv::ops::cpu_fma_peak_loop);
  // How the native route's parallel regions ran: [regions closed, of them waited on a late thread, regions
  // started on the caller alone (a busy machine), of them finished there, serial budget now in ns]; and setting
  // that budget (tests of both paths; 0 forgets the waits). native/region_stalls.h says why.
  m.def("cpu_parallel_region_info() -> int[]", &spconv::ops::cpu_parallel_region_info);
  m.def("cpu_parallel_region_set_budget(int ns) -> ()", &spconv::ops::cpu_parallel_region_set_budget);
#endif
}
