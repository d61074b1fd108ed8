// Op outputs of many megabytes on the CPU. Fresh memory faults in page by page on its first write; on a 64 MB
// output that took about 20 ms of the kernel's time on two threads (half of a depthwise layer). The memory is
// advised for transparent huge pages before anything touches it, so it faults in 2 MB at a time: a hint on
// memory the op owns, nothing process-wide (systems without THP, or with it off, ignore it).
#pragma once
#include <ATen/ATen.h>

#include <cstdint>

#if defined(__linux__)
#include <sys/mman.h>
#endif

namespace spconv {
namespace ops {

constexpr int64_t kHugePage = int64_t{2} << 20;

inline void advise_huge_pages(const at::Tensor& t) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (bytes < 2 * kHugePage) return;
  const uintptr_t p = reinterpret_cast<uintptr_t>(t.data_ptr());
  const uintptr_t begin = (p + kHugePage - 1) & ~static_cast<uintptr_t>(kHugePage - 1);
  const uintptr_t end = (p + static_cast<uintptr_t>(bytes)) & ~static_cast<uintptr_t>(kHugePage - 1);
  if (end > begin) madvise(reinterpret_cast<void*>(begin), end - begin, MADV_HUGEPAGE);  // a hint: errors ignored
#else
  (void)t;
#endif
}

inline at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  at::Tensor t = at::empty(sizes, options);
  advise_huge_pages(t);
  return t;
}

inline at::Tensor zeros_output(at::IntArrayRef sizes, const at::TensorOptions& options) {
  return empty_output(sizes, options).zero_();
}

}  // namespace ops
}  // namespace spconv
