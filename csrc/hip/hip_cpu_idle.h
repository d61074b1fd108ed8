// Idle backoff of the HIP CPU test build (included before the runtime's headers; nothing elsewhere).
//
// The runtime's stream processor thread polls its streams forever once the first kernel is launched, with a
// `pause` between polls and never a sleep, so every process that has run a kernel keeps one core busy until it
// exits: a test worker that ran one HIP CPU test slows every later test on the machine. The runtime calls
// YieldProcessor() for its pause where the platform defines it (hip/detail/helpers.hpp), so this defines it:
// a pause while the caller has been pausing for less than kIdleAfter, a short sleep per poll after that. A
// streak of pauses ends at the first gap longer than kGap between two calls (the thread did other work: it ran
// a kernel or took a lock), so a thread that is given kernels back to back, or that spins briefly on a lock,
// never sleeps.
#ifndef SPCONV_HIP_CPU_IDLE_H
#define SPCONV_HIP_CPU_IDLE_H

#include <chrono>
#include <thread>

namespace spconv_hip_cpu_idle {

inline void pause() {
#if defined(__has_builtin)
#if __has_builtin(__builtin_ia32_pause)
  return __builtin_ia32_pause();
#endif
#endif
  std::this_thread::yield();
}

using Clock = std::chrono::steady_clock;
// Running a kernel takes 10 us or more on this runtime (a thread is started per run); two pauses of a polling
// thread follow each other within 1 us.
constexpr auto kGap = std::chrono::microseconds(5);        // longer between two calls: a new streak
constexpr auto kIdleAfter = std::chrono::milliseconds(1);  // pausing this long: the thread is idle
constexpr auto kSleep = std::chrono::microseconds(200);    // an idle thread's wait
constexpr auto kLongIdle = std::chrono::milliseconds(50);  // idle this long: no kernel is coming soon
constexpr auto kLongSleep = std::chrono::milliseconds(2);  // its wait
// The runtime pauses up to a thousand times between two polls of its streams: an idle thread sleeps at the first
// of them and returns at once from the others for kAwake, so that each poll waits about one sleep.
constexpr auto kAwake = std::chrono::microseconds(20);

inline void pause_or_sleep() {
  thread_local Clock::time_point streak_start{}, last{}, woke{};
  Clock::time_point now = Clock::now();
  if (now - last > kGap) streak_start = now;
  if (now - streak_start <= kIdleAfter) {
    pause();
  } else if (now - woke > kAwake) {
    std::this_thread::sleep_for(now - streak_start > kLongIdle ? kLongSleep : kSleep);
    woke = now = Clock::now();
  }
  last = now;
}

}  // namespace spconv_hip_cpu_idle

#define YieldProcessor() ::spconv_hip_cpu_idle::pause_or_sleep()

#endif  // SPCONV_HIP_CPU_IDLE_H
