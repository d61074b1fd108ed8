#include "region_stalls.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>

#include <c10/util/Exception.h>

namespace spconv {
namespace native {
namespace {

// A wait counts when it is longer than this and longer than the caller's own work in the region: a quiet
// region waits for its other threads' last tasks only (microseconds); a late worker costs a time slice.
constexpr int64_t kMinStallNs = 250'000;
// The budget halves every this long without a new wait, so that a machine that has gone quiet is used in
// parallel again within a few hundred ms; a busy one renews it with its next late worker.
constexpr int64_t kHalfLifeNs = 50'000'000;
// No wait makes a region run alone for longer than this.
constexpr int64_t kMaxBudgetNs = 50'000'000;

std::atomic<int64_t> g_budget_ns{0};  // the budget the last wait set (or renewed), before its decay
std::atomic<int64_t> g_stamp_ns{0};  // when it was recorded
std::atomic<int64_t> g_regions{0};
std::atomic<int64_t> g_waited{0};
std::atomic<int64_t> g_started_alone{0};
std::atomic<int64_t> g_finished_alone{0};

// SPCONV_CPU_SERIAL_START: unset, empty or "1" on, "0" off; anything else is an error naming it (at every
// region until fixed: a function-local static whose initializer throws is tried again next time).
bool serial_start_enabled() {
  static const bool enabled = [] {
    const char* v = std::getenv("SPCONV_CPU_SERIAL_START");
    if (v == nullptr || *v == '\0' || std::strcmp(v, "1") == 0) return true;
    TORCH_CHECK_VALUE(std::strcmp(v, "0") == 0, "SPCONV_CPU_SERIAL_START must be 0 or 1, got '", v, "'");
    return false;
  }();
  return enabled;
}

}  // namespace

int64_t monotonic_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int64_t serial_budget_ns(int64_t now_ns) {
  const int64_t set = g_budget_ns.load(std::memory_order_relaxed);
  if (!serial_start_enabled() || set == 0) return 0;
  const int64_t halvings = std::max<int64_t>(now_ns - g_stamp_ns.load(std::memory_order_relaxed), 0) / kHalfLifeNs;
  const int64_t budget = halvings >= 62 ? 0 : set >> halvings;
  return budget < kMinStallNs ? 0 : budget;
}

void record_region_close(int64_t now_ns, int64_t busy_ns, int64_t idle_ns) {
  g_regions.fetch_add(1, std::memory_order_relaxed);
  if (idle_ns <= kMinStallNs || idle_ns <= busy_ns) return;
  g_waited.fetch_add(1, std::memory_order_relaxed);
  // Two callers racing here may pair one's wait with the other's stamp: either pair is a wait just seen.
  const int64_t renewed = std::min(std::max(idle_ns / 2, serial_budget_ns(now_ns)), kMaxBudgetNs);
  g_stamp_ns.store(now_ns, std::memory_order_relaxed);
  g_budget_ns.store(renewed, std::memory_order_relaxed);
}

bool finish_alone(int64_t elapsed_ns, int64_t done, int64_t left, int64_t budget_ns) {
  // elapsed / done * left < budget (tasks come longest first: the estimate errs long).
  return done > 0 && static_cast<double>(elapsed_ns) * static_cast<double>(left) <
                         static_cast<double>(budget_ns) * static_cast<double>(done);
}

void record_serial_start(bool finished) {
  g_started_alone.fetch_add(1, std::memory_order_relaxed);
  if (finished) g_finished_alone.fetch_add(1, std::memory_order_relaxed);
}

std::vector<int64_t> parallel_region_info() {
  return {g_regions.load(), g_waited.load(), g_started_alone.load(), g_finished_alone.load(),
          serial_budget_ns(monotonic_ns())};
}

void set_serial_budget_ns(int64_t ns) {
  g_stamp_ns.store(monotonic_ns(), std::memory_order_relaxed);
  g_budget_ns.store(std::clamp<int64_t>(ns, 0, kMaxBudgetNs), std::memory_order_relaxed);
}

}  // namespace native
}  // namespace spconv
