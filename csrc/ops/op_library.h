// Which torch op library the schemas (schema.cpp) and the GPU glue (csrc/ops/gpu) register into.
//  * Normal builds: namespace spconv, GPU glue on the CUDA dispatch key (ROCm torch uses it too).
//  * HIP CPU test build (SPCONV_HIP_CPU, tools/hip_cpu_build.py): a namespace of its own per build
//    variant (SPCONV_OP_NAMESPACE, default spconv_hipcpu) with the GPU glue on the CPU key, so that CPU
//    tensors run the real glue and the real kernels without clashing with the spconv ops.
#pragma once
#include <torch/library.h>

#if defined(SPCONV_HIP_CPU)
#ifndef SPCONV_OP_NAMESPACE
#define SPCONV_OP_NAMESPACE spconv_hipcpu
#endif
#define SPCONV_GPU_DISPATCH_KEY CPU
#else
#undef SPCONV_OP_NAMESPACE
#define SPCONV_OP_NAMESPACE spconv
#define SPCONV_GPU_DISPATCH_KEY CUDA
#endif

// One level of indirection so that the namespace macro expands before TORCH_LIBRARY pastes it.
#define SPCONV_TORCH_LIBRARY_(ns, m) TORCH_LIBRARY(ns, m)
#define SPCONV_TORCH_LIBRARY_IMPL_(ns, key, m) TORCH_LIBRARY_IMPL(ns, key, m)
#define SPCONV_SCHEMA(m) SPCONV_TORCH_LIBRARY_(SPCONV_OP_NAMESPACE, m)
#define SPCONV_GPU_IMPL(m) SPCONV_TORCH_LIBRARY_IMPL_(SPCONV_OP_NAMESPACE, SPCONV_GPU_DISPATCH_KEY, m)
