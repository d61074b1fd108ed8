// Partial sums added into their destination as one set of tasks over chunks of elements: one parallel region
// (a parallel add per partial would be a region each, and on a busy machine every region's barrier waits for a
// descheduled thread). Each element still adds the partials one by one in order, as the per-partial adds did:
// the bits don't change, whatever the thread count.
#pragma once
#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>

#include "run_tasks.h"

namespace spconv {
namespace native {

// d[i] += parts[0][i], then parts[1][i], ... (count partials, stride elements apart), for i in [i0, i1).
template <typename T>
inline void add_in_order(T* d, const T* parts, int64_t count, int64_t stride, int64_t i0, int64_t i1) {
  for (int64_t j = 0; j < count; ++j) {
    const T* src = parts + j * stride;
    for (int64_t i = i0; i < i1; ++i) d[i] += src[i];
  }
}

// dst += parts[0], then parts[1], ...; dst and parts[i] contiguous, of one floating dtype and dst.numel()
// elements each.
inline void add_partials_in_order(const at::Tensor& parts, at::Tensor& dst) {
  constexpr int64_t kChunk = 16384;
  const int64_t len = dst.numel(), n = parts.size(0), chunks = (len + kChunk - 1) / kChunk;
  if (n == 0 || chunks == 0) return;
  TORCH_INTERNAL_ASSERT(dst.is_contiguous() && parts.is_contiguous() && dst.scalar_type() == parts.scalar_type() &&
                        parts.numel() == n * len);
  AT_DISPATCH_FLOATING_TYPES(dst.scalar_type(), "add_partials_in_order", [&] {
    const scalar_t* p = parts.const_data_ptr<scalar_t>();
    scalar_t* d = dst.mutable_data_ptr<scalar_t>();
    run_tasks(chunks, [&] {
      return [&](int64_t t) {
        add_in_order(d, p, n, len, t * kChunk, std::min(len, (t + 1) * kChunk));
      };
    });
  });
}

// parts[0] + parts[1] + ... added element by element in that order, as a new tensor shaped like parts[0]; parts
// contiguous, of one floating dtype (the fixed blocks' partials of a filter gradient).
inline at::Tensor sum_partials_in_order(const at::Tensor& parts) {
  at::Tensor total = parts[0].clone();
  if (parts.size(0) > 1) add_partials_in_order(parts.narrow(0, 1, parts.size(0) - 1), total);
  return total;
}

}  // namespace native
}  // namespace spconv
