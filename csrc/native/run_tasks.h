// Dynamic task scheduling of the native route's kernels: pair density varies a lot across a scan, so a static
// split of the rows leaves a thread idle for a large part of the run.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/ParallelGuard.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <thread>

#include "region_stalls.h"

namespace spconv {
namespace native {

struct NoThreadSetup {};

// Runs task(t) for t in [0, n): each worker constructs a ThreadSetup (e.g. OneThreadGemm) for its whole share,
// builds its task with make_worker() (its scratch lives there) and pulls tasks off a shared counter, in the
// order t ascending (callers order their work longest first). Every task writes only its own output: which
// worker ran it never changes the bits. On a busy machine the caller may run the first tasks alone and open
// the parallel region only for what is left after its serial budget (region_stalls.h).
template <typename ThreadSetup = NoThreadSetup, typename MakeWorker>
void run_tasks(int64_t n, const MakeWorker& make_worker) {
  if (n <= 0) return;
  std::atomic<int64_t> next{0};
  auto drain = [&](auto& task) {
    for (int64_t t; (t = next.fetch_add(1, std::memory_order_relaxed)) < n;) task(t);
  };
  const int64_t threads = at::get_num_threads();
  // The caller's setup and worker serve its whole share: a one-thread run, or its serial start and its part of
  // the parallel region. Tasks (and the worker's construction) run on one thread under a ParallelGuard, as
  // at::parallel_for's inline runs do: the ATen ops they call stay on that thread instead of opening regions.
  ThreadSetup setup;
  auto task = [&] {
    c10::ParallelGuard inline_run(true);
    return make_worker();
  }();
  if (threads <= 1 || n == 1 || at::in_parallel_region()) {
    c10::ParallelGuard inline_run(true);
    drain(task);
    return;
  }
  const int64_t start = monotonic_ns(), budget = serial_budget_ns(start);
  if (budget > 0) {
    c10::ParallelGuard inline_run(true);  // released before the parallel region below opens
    const int64_t until = start + budget;
    int64_t t = 0;
    while ((t = next.fetch_add(1, std::memory_order_relaxed)) < n) {
      task(t);
      const int64_t now = monotonic_ns();
      if (now >= until && !finish_alone(now - start, t + 1, n - t - 1, budget)) break;
    }
    const bool finished = t >= n - 1;
    record_serial_start(finished);
    if (finished) return;
  }
  const int64_t left = n - next.load(std::memory_order_relaxed);
  const std::thread::id caller = std::this_thread::get_id();
  int64_t caller_start = 0, caller_done = 0;
  at::parallel_for(0, std::clamp<int64_t>(threads, 1, left), 1, [&](int64_t, int64_t) {
    if (std::this_thread::get_id() == caller) {
      caller_start = monotonic_ns();
      drain(task);
      caller_done = monotonic_ns();
      return;
    }
    ThreadSetup thread_setup;
    auto thread_task = make_worker();
    drain(thread_task);
  });
  if (caller_done != 0) {
    const int64_t now = monotonic_ns();
    record_region_close(now, caller_done - caller_start, now - caller_done);
  }
}

}  // namespace native
}  // namespace spconv
