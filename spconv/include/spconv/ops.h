// The spconv op library for C++ programs (no Python needed).
//
// Loading the library (spconv/_C_hip*.so) registers the operators spconv::* with the torch dispatcher
// (schemas: torch.ops.spconv.* in Python); that is what an AOTInductor package exported from a spconv
// model calls, and what torch::Dispatcher finds by name. Link it through CMake's
// find_package(Spconv) (target spconv::ops), or dlopen it.
//
// Public: the operators (csrc/ops/schema.cpp) and this header's one symbol; the spconv_debug::* diagnostics the
// library also registers (csrc/ops/debug_schema.cpp) are for the project's tests and tools. spconv_build_info() returns what the library was
// built with, as JSON; calling it also keeps a linker with --as-needed from dropping the library.
#pragma once

#define SPCONV_API __attribute__((visibility("default")))  // the library builds with -fvisibility=hidden

extern "C" SPCONV_API const char* spconv_build_info(void);
