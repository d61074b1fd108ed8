// PTX cp.async (global -> shared, 4/8/16 bytes, .ca / .cg, with src-size), cp.async.commit_group,
// cp.async.wait_group N and cp.async.wait_all for the HIP-CPU build (SPCONV_EMULATE_SM80). Never part of an
// nvcc or hipcc build (tc_sm80.h issues the real instructions there).
//
// Written from the PTX ISA, "cp.async" and "cp.async.wait_group": a copy is asynchronous to the thread that
// issues it; its destination holds its data only once the thread has waited for its group (and other threads
// see it only after a barrier that follows that wait). src-size bytes are read and the rest of the cp-size
// bytes are zero-filled. .cg takes 16 bytes only; addresses are aligned to cp-size. wait_group N waits for all
// committed groups but the newest N; copies not yet committed are not waited for; wait_all commits and waits
// for everything.
//
// So that a missing wait or barrier shows in tests, the emulation is as late as the ISA allows:
//  * at issue the destination is overwritten with 0xff bytes (a NaN in fp16, bf16 and fp32), and the copy is
//    recorded in the issuing thread's queue;
//  * the data is read from the source and written only by the issuing thread's wait that covers its group.
// A read of the destination before that wait, or by another thread without a barrier after it, sees the
// 0xff pattern (or stale data when the writer's fiber runs later), never the new data.
// Not reproduced: .ca / .cg cache behaviour (the same copy here), the L2 prefetch hints, ignore-src.
// A thread may have at most kCpAsyncPending copies outstanding (abort with a message beyond). The queue is
// reset when a thread of another block index takes it; a kernel must wait for its copies before it exits (a
// later launch's block of the same index would otherwise complete them).
#pragma once

#include <cstdint>
#include <cstring>

#include "warp_exchange.h"

namespace spconv_emu {

constexpr int kCpAsyncPending = 32;

struct CpAsyncCopy {
  void* dst;
  const void* src;
  uint32_t group;  // index of the commit group the copy belongs to
  uint8_t bytes, src_bytes;
};

struct CpAsyncThread {
  CpAsyncCopy copy[kCpAsyncPending];
  int count;
  uint32_t committed;  // groups committed so far
  uint32_t block;      // 1 + linear block index of the queue's owner
};

inline uint32_t linear_block() { return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z); }

// The calling thread's queue (block-shared storage, one entry per thread of the block).
inline CpAsyncThread& cp_async_thread() {
  __shared__ CpAsyncThread queues[kMaxBlockThreads];
  const unsigned t = linear_thread();
  if (t >= unsigned(kMaxBlockThreads)) warp_fail("cp.async", "block too large");
  CpAsyncThread& q = queues[t];
  if (q.block != linear_block() + 1) {  // a new block: copies an earlier one never waited for are dropped
    q.count = 0;
    q.committed = 0;
    q.block = linear_block() + 1;
  }
  return q;
}

inline void cp_async(void* dst, const void* src, int bytes, int src_bytes, bool cg) {
  if (bytes != 4 && bytes != 8 && bytes != 16) warp_fail("cp.async", "cp-size must be 4, 8 or 16");
  if (cg && bytes != 16) warp_fail("cp.async", ".cg copies 16 bytes only");
  if (src_bytes < 0 || src_bytes > bytes) warp_fail("cp.async", "src-size outside [0, cp-size]");
  if (reinterpret_cast<uintptr_t>(dst) % bytes != 0 || (src_bytes > 0 && reinterpret_cast<uintptr_t>(src) % bytes != 0))
    warp_fail("cp.async", "address not aligned to cp-size");
  CpAsyncThread& q = cp_async_thread();
  if (q.count == kCpAsyncPending) warp_fail("cp.async", "too many copies outstanding in one thread");
  std::memset(dst, 0xff, bytes);
  q.copy[q.count++] = CpAsyncCopy{dst, src, q.committed, static_cast<uint8_t>(bytes), static_cast<uint8_t>(src_bytes)};
}

inline void cp_async_commit_group() { ++cp_async_thread().committed; }

// Completes, in issue order, the copies of every committed group but the newest n.
inline void cp_async_wait_group(int n) {
  CpAsyncThread& q = cp_async_thread();
  int kept = 0;
  for (int i = 0; i < q.count; ++i) {
    const CpAsyncCopy c = q.copy[i];
    if (c.group + static_cast<uint32_t>(n) < q.committed) {
      unsigned char* d = static_cast<unsigned char*>(c.dst);
      if (c.src_bytes) std::memcpy(d, c.src, c.src_bytes);
      std::memset(d + c.src_bytes, 0, c.bytes - c.src_bytes);
    } else {
      q.copy[kept++] = c;
    }
  }
  q.count = kept;
}

inline void cp_async_wait_all() {
  cp_async_commit_group();
  cp_async_wait_group(0);
}

}  // namespace spconv_emu
