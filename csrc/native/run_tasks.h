// Dynamic task scheduling of the native route's kernels: pair density varies a lot across a scan, so a static
// split of the rows leaves a thread idle for a large part of the run.
#pragma once
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cstdint>

namespace spconv {
namespace native {

struct NoThreadSetup {};

// Runs task(t) for t in [0, n): each worker constructs a ThreadSetup (e.g. OneThreadGemm) for its whole share,
// builds its task with make_worker() (its scratch lives there) and pulls tasks off a shared counter, in the
// order t ascending (callers order their work longest first). Every task writes only its own output: which
// worker ran it never changes the bits.
template <typename ThreadSetup = NoThreadSetup, typename MakeWorker>
void run_tasks(int64_t n, const MakeWorker& make_worker) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  const int64_t workers = std::clamp<int64_t>(at::get_num_threads(), 1, n);
  at::parallel_for(0, workers, 1, [&](int64_t, int64_t) {
    ThreadSetup setup;
    auto task = make_worker();
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n;) task(t);
  });
}

}  // namespace native
}  // namespace spconv
