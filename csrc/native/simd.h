// Runtime choice of AVX2/FMA code paths: the extension is built for baseline x86-64 (SSE2), so hot
// hand-written loops are compiled a second time for AVX2+FMA and picked when the CPU has them.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define SPCONV_HAVE_AVX2_PATH 1
#define SPCONV_TARGET_AVX2 __attribute__((target("avx2,fma")))
// AVX-512 foundation (picked with cpu_has_avx512f()), with AVX2/FMA and popcnt for the code around it.
#define SPCONV_TARGET_AVX512 __attribute__((target("avx512f,avx2,fma,popcnt")))
#else
#define SPCONV_HAVE_AVX2_PATH 0
#define SPCONV_TARGET_AVX2
#define SPCONV_TARGET_AVX512
#endif

// Unrolls the loop that follows in full (GCC and Clang), so that register tiles indexed by its counter become
// registers rather than arrays in memory.
#define SPCONV_UNROLL _Pragma("GCC unroll 16")

#include <cstdlib>
#include <cstring>

namespace spconv {
namespace native {

// SPCONV_CPU_ISA (read once) caps what the run-time choice may pick: "generic", "avx2" or "avx512" (default:
// whatever the CPU has), so that one machine can run, and the tests compare, every path.
inline int cpu_isa_cap() {
  static const int cap = [] {
    const char* v = std::getenv("SPCONV_CPU_ISA");
    if (v == nullptr || *v == 0 || std::strcmp(v, "avx512") == 0) return 2;
    if (std::strcmp(v, "avx2") == 0) return 1;
    return 0;  // "generic", or anything else: the portable loops
  }();
  return cap;
}

inline bool cpu_has_avx2_fma() {
#if SPCONV_HAVE_AVX2_PATH
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_isa_cap() >= 1;
  return ok;
#else
  return false;
#endif
}

inline bool cpu_has_avx512f() {
#if SPCONV_HAVE_AVX2_PATH
  static const bool ok = __builtin_cpu_supports("avx512f") && cpu_isa_cap() >= 2;
  return ok;
#else
  return false;
#endif
}

// AVX-512 with the byte dot products of VNNI (and the BW/VL byte and 256-bit forms), for the int8 kernels.
inline bool cpu_has_avx512_vnni() {
#if SPCONV_HAVE_AVX2_PATH
  static const bool ok = cpu_has_avx512f() && __builtin_cpu_supports("avx512bw") &&
                         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512vnni");
  return ok;
#else
  return false;
#endif
}

// The instruction set the hand-written loops run with here (build_info's cpu_isa).
inline const char* cpu_isa_name() {
  return cpu_has_avx512f() && cpu_has_avx2_fma() ? "avx512" : cpu_has_avx2_fma() ? "avx2" : "generic";
}

}  // namespace native
}  // namespace spconv
