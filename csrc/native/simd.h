// Runtime choice of AVX2/FMA code paths: the extension is built for baseline x86-64 (SSE2), so hot
// hand-written loops are compiled a second time for AVX2+FMA and picked when the CPU has them.
#pragma once

#if defined(__x86_64__) && defined(__GNUC__)
#define SPCONV_HAVE_AVX2_PATH 1
#define SPCONV_TARGET_AVX2 __attribute__((target("avx2,fma")))
#else
#define SPCONV_HAVE_AVX2_PATH 0
#define SPCONV_TARGET_AVX2
#endif

namespace spconv {
namespace native {

inline bool cpu_has_avx2_fma() {
#if SPCONV_HAVE_AVX2_PATH
  static const bool ok = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return ok;
#else
  return false;
#endif
}

}  // namespace native
}  // namespace spconv
