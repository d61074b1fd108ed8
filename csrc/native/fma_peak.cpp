#include "fma_peak.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {
namespace {

// Independent accumulator chains per thread: two FMA pipes of four cycles' latency need eight; twelve leave room
// for cores with more, and stay in the 16 registers of AVX2.
constexpr int kChains = 12;

// The chains' values are summed into this so that no compiler drops the loop.
std::atomic<double> g_sink{0.0};

// x = x * b + c keeps every value bounded (b just under 1): no overflow, no denormals, whatever iters is.
template <typename T>
T portable_chains(int64_t iters) {
  T acc[kChains];
  for (int i = 0; i < kChains; ++i) acc[i] = static_cast<T>(i);
  const T b = static_cast<T>(0.999999), c = static_cast<T>(1e-6);
  for (int64_t k = 0; k < iters; ++k)
    for (int i = 0; i < kChains; ++i) acc[i] = acc[i] * b + c;
  T s = 0;
  for (int i = 0; i < kChains; ++i) s += acc[i];
  return s;
}

#if SPCONV_HAVE_AVX2_PATH
// The vector types' set1 / fma / horizontal sum, each compiled for its instruction set.
struct F512 {
  using V = __m512;
  SPCONV_TARGET_AVX512 static V set1(double v) { return _mm512_set1_ps(static_cast<float>(v)); }
  SPCONV_TARGET_AVX512 static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  SPCONV_TARGET_AVX512 static double sum(V a) { return _mm512_reduce_add_ps(a); }
};
struct D512 {
  using V = __m512d;
  SPCONV_TARGET_AVX512 static V set1(double v) { return _mm512_set1_pd(v); }
  SPCONV_TARGET_AVX512 static V fma(V a, V b, V c) { return _mm512_fmadd_pd(a, b, c); }
  SPCONV_TARGET_AVX512 static double sum(V a) { return _mm512_reduce_add_pd(a); }
};
struct F256 {
  using V = __m256;
  SPCONV_TARGET_AVX2 static V set1(double v) { return _mm256_set1_ps(static_cast<float>(v)); }
  SPCONV_TARGET_AVX2 static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  SPCONV_TARGET_AVX2 static double sum(V a) {
    alignas(32) float o[8];
    _mm256_store_ps(o, a);
    double s = 0;
    for (float v : o) s += v;
    return s;
  }
};
struct D256 {
  using V = __m256d;
  SPCONV_TARGET_AVX2 static V set1(double v) { return _mm256_set1_pd(v); }
  SPCONV_TARGET_AVX2 static V fma(V a, V b, V c) { return _mm256_fmadd_pd(a, b, c); }
  SPCONV_TARGET_AVX2 static double sum(V a) {
    alignas(32) double o[4];
    _mm256_store_pd(o, a);
    return o[0] + o[1] + o[2] + o[3];
  }
};

// The loop, once per instruction set: the target attribute must sit on the function that holds it, so that its
// vector helpers inline and the chains stay in registers.
#define SPCONV_FMA_CHAINS(NAME, TARGET)                                                   \
  template <typename S>                                                                   \
  TARGET double NAME(int64_t iters) {                                                     \
    typename S::V acc[kChains];                                                           \
    SPCONV_UNROLL for (int i = 0; i < kChains; ++i) acc[i] = S::set1(static_cast<double>(i)); \
    const typename S::V b = S::set1(0.999999), c = S::set1(1e-6);                         \
    for (int64_t k = 0; k < iters; ++k) {                                                 \
      SPCONV_UNROLL for (int i = 0; i < kChains; ++i) acc[i] = S::fma(acc[i], b, c);      \
    }                                                                                     \
    double s = 0;                                                                         \
    SPCONV_UNROLL for (int i = 0; i < kChains; ++i) s += S::sum(acc[i]);                  \
    return s;                                                                             \
  }
SPCONV_FMA_CHAINS(chains512, SPCONV_TARGET_AVX512)
SPCONV_FMA_CHAINS(chains256, SPCONV_TARGET_AVX2)
#undef SPCONV_FMA_CHAINS
#endif

double chains(int64_t iters, bool fp64) {
#if SPCONV_HAVE_AVX2_PATH
  if (cpu_has_avx512f()) return fp64 ? chains512<D512>(iters) : chains512<F512>(iters);
  if (cpu_has_avx2_fma()) return fp64 ? chains256<D256>(iters) : chains256<F256>(iters);
#endif
  return fp64 ? portable_chains<double>(iters) : static_cast<double>(portable_chains<float>(iters));
}

}  // namespace

int64_t fma_peak_lanes_per_step(bool fp64) {
  const int64_t bytes = cpu_has_avx512f() ? 64 : cpu_has_avx2_fma() ? 32 : (fp64 ? 8 : 4);
  return kChains * bytes / (fp64 ? 8 : 4);
}

int64_t fma_peak_loop(int64_t iters, bool fp64) {
  const int64_t workers = std::max<int64_t>(at::get_num_threads(), 1);
  std::atomic<int64_t> ran{0};
  // One chunk per thread, so that every thread runs the loop once (a grain of 1 over `workers` items).
  at::parallel_for(0, workers, 1, [&](int64_t b, int64_t e) {
    for (int64_t t = b; t < e; ++t) {
      const double s = chains(iters, fp64);
      g_sink.store(s, std::memory_order_relaxed);
      ran.fetch_add(1, std::memory_order_relaxed);
    }
  });
  return ran.load() * iters * 2 * fma_peak_lanes_per_step(fp64);
}

}  // namespace native
}  // namespace spconv
