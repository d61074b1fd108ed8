// Parallel regions on a machine whose cores other processes keep busy (a DataLoader's workers, other jobs).
// An OpenMP worker that spins after a region is preempted there, and when the next region starts it is
// runnable but not running: the caller runs every task itself and then waits at the region's closing barrier
// until the scheduler gets round to that worker, whole time slices of several ms, where a small layer's region
// takes 1-2 ms. run_tasks' caller measures that wait. While regions have waited lately, a region first runs its
// tasks on the caller alone for up to half the last such wait S and opens the parallel region only for the
// tasks left then (ski rental). Why half: a region of serial work W takes W alone, and in parallel about W / 2
// when its worker comes on time, max(S, (W + S) / 2) when it comes S late; with a late worker in one region out
// of two or three, alone wins while W is below about S / 2 (docs/routes.md, "CPU threads on a shared machine").
// When the budget runs out with little work left (at the pace of the tasks run so far, less than the budget),
// the caller finishes alone: a late worker would cost more than that, and a region a little longer than its
// budget would pay both.
// On a quiet machine no region waits, the budget stays 0 and every region is parallel from its start.
// SPCONV_CPU_SERIAL_START=0 keeps every region parallel from its start. Which thread runs a task never changes
// the bits (run_tasks.h), so neither does this.
#pragma once
#include <cstdint>
#include <vector>

namespace spconv {
namespace native {

// Nanoseconds on a monotonic clock.
int64_t monotonic_ns();

// How long a region starting at now_ns runs on its caller alone before it asks for threads (0: at once).
int64_t serial_budget_ns(int64_t now_ns);

// A parallel region's caller ran tasks for busy_ns, then waited idle_ns for the region to close.
void record_region_close(int64_t now_ns, int64_t busy_ns, int64_t idle_ns);

// Whether a region whose caller ran `done` of its tasks alone in elapsed_ns, past its budget_ns, runs the
// `left` others alone too: they would take less than the budget at the pace so far.
bool finish_alone(int64_t elapsed_ns, int64_t done, int64_t left, int64_t budget_ns);

// A region started on its caller alone (its budget was not 0); finished: all its tasks ran there.
void record_serial_start(bool finished);

// [parallel regions closed, of them waited on a late thread, regions started on the caller alone, of them
//  finished there, serial budget now (ns)], counted since the library was loaded (cpu_parallel_region_info).
std::vector<int64_t> parallel_region_info();

// Sets the budget to ns as if a region had just waited (0 forgets every wait): for tests of both paths.
void set_serial_budget_ns(int64_t ns);

}  // namespace native
}  // namespace spconv
