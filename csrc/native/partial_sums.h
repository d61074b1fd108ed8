// Partial sums added into their destinations as one set of tasks over chunks of elements. A parallel add per
// partial was a parallel region each (55 for one SubM 256 backward), and on a busy machine every region's
// barrier waits for a descheduled thread. Each element still adds its partials one by one in the given order,
// as the per-partial adds did: the bits don't change, whatever the thread count.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "run_tasks.h"

namespace spconv {
namespace native {

// dst[at + i] += parts[first][i], then parts[first + 1][i], ... (count partials), for i in [0, len).
struct PartialRun {
  int64_t at, first, count;
};

// dst and parts contiguous, of one floating dtype; parts [n, len].
inline void add_partial_runs(const std::vector<PartialRun>& runs, int64_t len, const at::Tensor& parts,
                             at::Tensor& dst) {
  constexpr int64_t kChunk = 16384;
  const int64_t chunks = (len + kChunk - 1) / kChunk;
  if (runs.empty() || chunks == 0) return;
  TORCH_INTERNAL_ASSERT(dst.is_contiguous() && parts.is_contiguous() && dst.scalar_type() == parts.scalar_type());
  AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "add_partial_runs", [&] {
    const scalar_t* p = parts.const_data_ptr<scalar_t>();
    scalar_t* d = dst.mutable_data_ptr<scalar_t>();
    run_tasks(static_cast<int64_t>(runs.size()) * chunks, [&] {
      return [&](int64_t t) {
        const PartialRun& r = runs[t / chunks];
        const int64_t i0 = t % chunks * kChunk, i1 = std::min(len, i0 + kChunk);
        scalar_t* out = d + r.at + i0;
        for (int64_t j = 0; j < r.count; ++j) {
          const scalar_t* src = p + (r.first + j) * len + i0;
          for (int64_t i = 0; i < i1 - i0; ++i) out[i] += src[i];
        }
      };
    });
  });
}

}  // namespace native
}  // namespace spconv
