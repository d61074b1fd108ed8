// Rows copied by an index list, to and from a dense buffer (the gathers and scatters around a vendor GEMM):
// rows are fetched in a data-dependent order the hardware prefetcher can't follow, so each copy requests a few
// rows ahead.
#pragma once
#include <cstdint>
#include <cstring>

namespace spconv {
namespace native {

// How many rows ahead of the one copied a copy requests.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
inline void prefetch_row(const T* row, int64_t c, int write) {
  for (int64_t j = 0; j < c; j += 64 / static_cast<int64_t>(sizeof(T))) {
    if (write) __builtin_prefetch(row + j, 1);
    else __builtin_prefetch(row + j, 0);
  }
}

template <typename T>
inline void gather_rows(const T* src, int64_t c, const int32_t* idx, int64_t m, T* buf) {
  for (int64_t r = 0; r < m; ++r) {
    if (r + kPrefetchRows < m) prefetch_row(src + static_cast<int64_t>(idx[r + kPrefetchRows]) * c, c, 0);
    std::memcpy(buf + r * c, src + static_cast<int64_t>(idx[r]) * c, sizeof(T) * c);
  }
}

template <typename T>
inline void scatter_add_rows(const T* buf, int64_t c, const int32_t* idx, int64_t m, T* dst) {
  for (int64_t r = 0; r < m; ++r) {
    if (r + kPrefetchRows < m) prefetch_row(dst + static_cast<int64_t>(idx[r + kPrefetchRows]) * c, c, 1);
    T* d = dst + static_cast<int64_t>(idx[r]) * c;
    const T* s = buf + r * c;
    for (int64_t j = 0; j < c; ++j) d[j] += s[j];
  }
}

}  // namespace native
}  // namespace spconv
