// Which torch op library the schemas (schema.cpp) and the GPU glue (csrc/ops/gpu) register into.
//  * Normal builds: namespace spconv, GPU glue on the CUDA dispatch key (ROCm torch uses it too).
//  * HIP CPU test build (SPCONV_HIP_CPU, tools/hip_cpu_build.py): a namespace of its own per build
//    variant with the GPU glue on the CPU key, so that CPU tensors run the real glue and the real kernels
//    without clashing with the spconv ops.
// The namespace is a run-time string (op_namespace.h): these files compile the same for every variant.
// Diagnostics (counters, budgets, benchmark loops: what tests, benchmarks and tools call, never a model) register
// into a namespace of their own beside it, "<namespace>_debug" (debug_schema.cpp), so that the user's namespace
// holds the user's operators alone.
#pragma once
#include <torch/library.h>

#include "op_namespace.h"

#if defined(SPCONV_HIP_CPU)
#define SPCONV_GPU_DISPATCH_KEY CPU
#else
#define SPCONV_GPU_DISPATCH_KEY CUDA
#endif

// TORCH_LIBRARY / TORCH_LIBRARY_IMPL with the namespace taken from op_namespace(): the same static
// registration object as torch's macros, which paste the namespace in as a token.
#define SPCONV_LIBRARY_INIT_(kind, ns, key, m, uid)                                                               \
  static void C10_CONCATENATE(spconv_library_init_, uid)(torch::Library&);                                      \
  static const torch::detail::TorchLibraryInit C10_CONCATENATE(spconv_library_static_init_, uid)(               \
      torch::Library::kind, &C10_CONCATENATE(spconv_library_init_, uid), ns, key, __FILE__, __LINE__);          \
  void C10_CONCATENATE(spconv_library_init_, uid)(torch::Library & m)
#define SPCONV_SCHEMA(m) SPCONV_LIBRARY_INIT_(DEF, spconv::ops::op_namespace(), std::nullopt, m, C10_UID)
#define SPCONV_GPU_IMPL(m)                                                                                      \
  SPCONV_LIBRARY_INIT_(IMPL, spconv::ops::op_namespace(),                                                       \
                       std::make_optional(c10::DispatchKey::SPCONV_GPU_DISPATCH_KEY), m, C10_UID)
// The diagnostics' namespace: its schema (debug_schema.cpp), and more of its operators declared elsewhere (the
// test build's launch ledger).
#define SPCONV_DEBUG_SCHEMA(m) SPCONV_LIBRARY_INIT_(DEF, spconv::ops::debug_op_namespace(), std::nullopt, m, C10_UID)
#define SPCONV_DEBUG_SCHEMA_FRAGMENT(m) \
  SPCONV_LIBRARY_INIT_(FRAGMENT, spconv::ops::debug_op_namespace(), std::nullopt, m, C10_UID)
