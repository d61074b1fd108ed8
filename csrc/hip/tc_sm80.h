// The sm_80 tensor-core instructions a pipelined implicit GEMM uses, behind one device API:
//   mma_m16n8k16<T>   mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32 (d += a * b)
//   ldmatrix<N, Trans> ldmatrix.sync.aligned.m8n8.x{1,2,4}{,.trans}.shared.b16
//   cp_async<Bytes>  cp.async.ca.shared.global (4, 8, 16 bytes) / .cg (16 bytes), src-size zero-fill
//   cp_async_commit, cp_async_wait_group<N>, cp_async_wait_all
//   warp_any         vote.sync.any.pred over the 32 lanes of the warp
// nvcc for sm_80 and later: inline PTX. HIP-CPU build with SPCONV_EMULATE_SM80: the emulators of csrc/hip/emu
// (mma_sync_emu.h, ldmatrix_emu.h, cp_async_emu.h, vote_emu.h; their comments state the layouts). Either way
// SPCONV_DEVICE_SM80 is defined; elsewhere (other targets, the host pass) nothing here is declared.
// Include after hip_compat.h.
#pragma once

#include "hip_compat.h"

#if defined(SPCONV_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPCONV_DEVICE_SM80 1
#define SPCONV_SM80_PTX 1
#elif defined(SPCONV_HIP_CPU) && defined(SPCONV_EMULATE_SM80)
#include "emu/cp_async_emu.h"
#include "emu/ldmatrix_emu.h"
#include "emu/mma_sync_emu.h"
#include "emu/vote_emu.h"
#define SPCONV_DEVICE_SM80 1
#endif

#if defined(SPCONV_DEVICE_SM80)
#include <type_traits>

namespace spconv {
namespace gpu {
namespace tc {

#if defined(SPCONV_SM80_PTX)
__device__ __forceinline__ uint32_t shared_address(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
#endif

// d += A * B for one 16x8x16 tile; T is __half or bf16_t (the A and B element type).
template <typename T>
__device__ __forceinline__ void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  static_assert(std::is_same<T, __half>::value || std::is_same<T, bf16_t>::value, "fp16 or bf16 operands");
#if defined(SPCONV_SM80_PTX)
  if constexpr (std::is_same<T, __half>::value) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};\n"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#else
  spconv_emu::mma_m16n8k16(a, b, d, std::is_same<T, bf16_t>::value);
#endif
}

// N 8x8 matrices of 16-bit elements from shared memory; this lane gives the address of one row (lanes 8i..8i+7:
// rows 0..7 of matrix i; 16-byte aligned).
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 1 || N == 2 || N == 4, ".x1, .x2 or .x4");
#if defined(SPCONV_SM80_PTX)
  const uint32_t s = shared_address(row);
  if constexpr (N == 1 && !Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
  } else if constexpr (N == 1) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x1.trans.shared.b16 {%0}, [%1];\n" : "=r"(r[0]) : "r"(s) : "memory");
  } else if constexpr (N == 2 && !Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
  } else if constexpr (N == 2) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0, %1}, [%2];\n"
                 : "=r"(r[0]), "=r"(r[1]) : "r"(s) : "memory");
  } else if constexpr (!Trans) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
  } else {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(s) : "memory");
  }
#else
  spconv_emu::ldmatrix_m8n8<N>(r, row, Trans);
#endif
}

// Bytes (4, 8 or 16) from global src to shared dst, of which the first src_bytes are read and the rest zeroed
// (src_bytes 0: src is not read). Bytes == 16 takes .cg (bypasses L1: gathered rows are read once per tile),
// smaller copies .ca. Both addresses aligned to Bytes.
template <int Bytes>
__device__ __forceinline__ void cp_async(void* dst, const void* src, int src_bytes) {
  static_assert(Bytes == 4 || Bytes == 8 || Bytes == 16, "cp-size 4, 8 or 16");
#if defined(SPCONV_SM80_PTX)
  const uint32_t s = shared_address(dst);
  const size_t g = __cvta_generic_to_global(src);
  if constexpr (Bytes == 16) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" : : "r"(s), "l"(g), "r"(src_bytes) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;\n"
                 : : "r"(s), "l"(g), "n"(Bytes), "r"(src_bytes) : "memory");
  }
#else
  spconv_emu::cp_async(dst, src, Bytes, src_bytes, Bytes == 16);
#endif
}

__device__ __forceinline__ void cp_async_commit() {
#if defined(SPCONV_SM80_PTX)
  asm volatile("cp.async.commit_group;\n" : : : "memory");
#else
  spconv_emu::cp_async_commit_group();
#endif
}

// Waits for this thread's committed groups but the newest N (other threads see the data after a barrier).
template <int N>
__device__ __forceinline__ void cp_async_wait_group() {
#if defined(SPCONV_SM80_PTX)
  asm volatile("cp.async.wait_group %0;\n" : : "n"(N) : "memory");
#else
  spconv_emu::cp_async_wait_group(N);
#endif
}

__device__ __forceinline__ void cp_async_wait_all() {
#if defined(SPCONV_SM80_PTX)
  asm volatile("cp.async.wait_all;\n" : : : "memory");
#else
  spconv_emu::cp_async_wait_all();
#endif
}

// Whether p holds in any lane of this thread's warp; every lane of the warp calls it.
__device__ __forceinline__ bool warp_any(bool p) {
#if defined(SPCONV_SM80_PTX)
  return __any_sync(0xffffffffu, p);
#else
  return spconv_emu::vote_any(p);
#endif
}

// How a warp leaves out the multiplies of a step it has no rows for. On the GPU a branch skips them. The
// emulated instructions exchange lanes through block barriers, so there every warp makes every call and an
// idle warp's products go to a scratch accumulator instead: the same bits as the branch.
#if defined(SPCONV_SM80_PTX)
constexpr bool kSkipByBranch = true;
#else
constexpr bool kSkipByBranch = false;
#endif

}  // namespace tc
}  // namespace gpu
}  // namespace spconv
#endif  // SPCONV_DEVICE_SM80
