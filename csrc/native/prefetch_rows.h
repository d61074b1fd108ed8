// Software prefetch of gathered rows: a kernel requests the next tile's rows while it computes this one. The
// gathers miss the cache in no order a hardware prefetcher follows.
#pragma once
#include <cstdint>

namespace spconv {
namespace native {

// Every cache line of rows gather[0..rows) of x (cols elements each, rows ld apart: cols by default), into L1
// (Level 3) or L2 (Level 2). Always inlined: GCC deems a function whose only effect is a prefetch free of side
// effects and drops the calls to it.
template <int Level = 3, typename T>
inline __attribute__((always_inline)) void prefetch_rows(const T* x, int64_t cols, const int32_t* gather, int64_t rows,
                                                         int64_t ld = -1) {
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(T)), stride = ld < 0 ? cols : ld;
  for (int64_t i = 0; i < rows; ++i) {
    const char* r = reinterpret_cast<const char*>(x + static_cast<int64_t>(gather[i]) * stride);
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(r + b, 0, Level);
  }
}

}  // namespace native
}  // namespace spconv
