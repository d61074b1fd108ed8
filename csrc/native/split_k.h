// The split-K plan of a filter gradient dw[k] = sum over offset k's pairs of x[in]^T dy[out]: each offset's
// pairs are cut into segments of about the same length; an offset's first segment writes dw[k] itself, the
// others write partials of their own, added afterwards in segment order. The plan depends on the sizes only,
// so the bits don't depend on the thread count; the segments are long enough that each GEMM has a large K and
// the partials stay few.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "partial_sums.h"

namespace spconv {
namespace native {

struct KSegment {
  int64_t k, begin, end, slot;  // pairs [begin, end) of offset k; slot < 0: written to dw[k] itself
};

struct SplitK {
  int64_t rows = 0;  // pairs gathered per GEMM chunk: both gathered chunks together stay within L2
  std::vector<KSegment> segs;
  int64_t n_partials = 0;
};

// offsets [kvol + 1] of pairs with c_in / c_out channels of elem_size bytes; dw[k] of offsets without pairs is
// zeroed here.
inline SplitK plan_split_k(const int64_t* offsets, int64_t kvol, int64_t c_in, int64_t c_out, int64_t elem_size,
                           at::Tensor& dw) {
  constexpr int64_t kTargetSegments = 64;
  SplitK p;
  p.rows = std::clamp<int64_t>((int64_t{1} << 19) / ((c_in + c_out) * elem_size), 128, 2048);
  const int64_t total = offsets[kvol] - offsets[0];
  const int64_t seg_len = std::max(p.rows, (total + kTargetSegments - 1) / kTargetSegments / p.rows * p.rows);
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t count = offsets[k + 1] - offsets[k];
    if (count == 0) {
      dw[k].zero_();
      continue;
    }
    const int64_t n_seg = (count + seg_len - 1) / seg_len;
    for (int64_t s = 0; s < n_seg; ++s)
      p.segs.push_back({k, offsets[k] + count * s / n_seg, offsets[k] + count * (s + 1) / n_seg,
                        s == 0 ? -1 : p.n_partials++});
  }
  return p;
}

// dw[k] += the partials of its later segments, in segment order, added by the task that finishes the offset's
// last segment: no pass of its own over the partials, and no parallel region (on a busy machine each region's
// barrier waits for a descheduled thread). The adds' order is fixed: the bits don't depend on which thread
// finishes last.
class PartialsCountdown {
 public:
  explicit PartialsCountdown(const SplitK& p, int64_t kvol) : left_(kvol), first_(kvol, -1), count_(kvol, 0) {
    for (const KSegment& sg : p.segs) {
      left_[sg.k].fetch_add(1, std::memory_order_relaxed);
      if (sg.slot < 0) continue;
      if (first_[sg.k] < 0) first_[sg.k] = sg.slot;  // an offset's slots are consecutive
      ++count_[sg.k];
    }
  }

  // After segment sg's product is written; part [n_partials, len], dw [kvol, len].
  template <typename T>
  void segment_done(const KSegment& sg, const T* part, T* dw, int64_t len) {
    if (left_[sg.k].fetch_sub(1, std::memory_order_acq_rel) != 1) return;  // acquire: the others' partials
    if (count_[sg.k] > 0) add_in_order(dw + sg.k * len, part + first_[sg.k] * len, count_[sg.k], len, 0, len);
  }

 private:
  std::vector<std::atomic<int64_t>> left_;
  std::vector<int64_t> first_, count_;
};

}  // namespace native
}  // namespace spconv
