// Portability header: the GPU sources are written in HIP spelling and compile with hipcc (AMD/Hygon,
// ROCm/DTK >= 5.2) and with nvcc (NVIDIA). Include this before any other project header in a .cu file.
// Nothing here assumes a 32-wide warp: gfx9 (CDNA, DCU) wavefronts are 64 wide, gfx10+ and NVIDIA are 32.
#pragma once

#include <cstdint>
#include <utility>
#if defined(SPCONV_HIP_CPU)
#include <chrono>
#endif

#if defined(SPCONV_HIP_CPU)
// HIP CPU runtime (tests only: runs the kernels on the host, one fiber per GPU thread, 64-wide
// wavefronts). Its hipDeviceProp_t lacks the AMD fields, so it is neither SPCONV_HIP nor SPCONV_CUDA.
#include "hip_cpu_idle.h"  // before the runtime: its stream thread sleeps when idle instead of spinning
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
// Without NDEBUG the runtime defines __forceinline__ as nothing: header helpers would collide at link.
#undef __forceinline__
#define __forceinline__ inline __attribute__((always_inline))
#include "hip_cpu_thread_order.h"  // the tests run the kernels in ascending and in descending thread order
#elif defined(__HIP__) || defined(__HIP_PLATFORM_AMD__) || defined(__HIP_PLATFORM_HCC__)
#define SPCONV_HIP 1
#include <hip/hip_runtime.h>
#include <hip/hip_fp16.h>
#elif defined(__CUDACC__)
#define SPCONV_CUDA 1
#include <cuda_runtime.h>
#include <cuda_fp16.h>
// The runtime names used by the kernels, mapped onto CUDA.
#define hipStream_t cudaStream_t
#define hipError_t cudaError_t
#define hipSuccess cudaSuccess
#define hipGetLastError cudaGetLastError
#define hipGetErrorString cudaGetErrorString
#define hipMemsetAsync cudaMemsetAsync
#define hipErrorInvalidValue cudaErrorInvalidValue
#define hipDeviceProp_t cudaDeviceProp
#define hipGetDeviceProperties cudaGetDeviceProperties
#define hipMemcpyAsync cudaMemcpyAsync
#define hipMemcpyDeviceToDevice cudaMemcpyDeviceToDevice
#define hipGetDevice cudaGetDevice
#define hipDeviceGetAttribute cudaDeviceGetAttribute
#else
#error "hip_compat.h needs hipcc, nvcc or the HIP CPU runtime (SPCONV_HIP_CPU)"
#endif

// ---- warp / wavefront size: a compile-time constant of the device target, never hard-coded ----
#if defined(SPCONV_HIP_CPU)
#define SPCONV_WARP_SIZE 64  // the HIP CPU runtime's warpSize
#elif defined(SPCONV_HIP)
#if defined(__AMDGCN_WAVEFRONT_SIZE__)
#define SPCONV_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE__
#elif defined(__AMDGCN_WAVEFRONT_SIZE)
#define SPCONV_WARP_SIZE __AMDGCN_WAVEFRONT_SIZE
#elif defined(__HIP_DEVICE_COMPILE__)
// A guess would be wrong on half the targets (gfx9 is wave64, gfx10+ wave32 by default).
#error "hip_compat.h: the device compiler defines no wavefront size (__AMDGCN_WAVEFRONT_SIZE[__])"
#else
// Host pass: used only so that device function bodies (parsed here, compiled in the device pass) type-check;
// nothing the host runs may depend on it (query hipDeviceProp_t::warpSize at run time for that).
#define SPCONV_WARP_SIZE 64
#endif
#else
#define SPCONV_WARP_SIZE 32
#endif

// ---- matrix cores available on the device target being compiled ----
#if defined(SPCONV_CUDA) && defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
#define SPCONV_DEVICE_WMMA 1  // mma.sync / WMMA fp16 and bf16 (Ampere and later)
#endif
#if defined(SPCONV_HIP) && (defined(__gfx90a__) || defined(__gfx940__) || defined(__gfx941__) || defined(__gfx942__))
#define SPCONV_DEVICE_MFMA 1  // MFMA with fp16 and bf16_1k inputs (CDNA2/CDNA3)
#endif

// ---- emulated matrix cores (HIP-CPU build only): the WMMA or MFMA bodies then run on the CPU in tests ----
#if defined(SPCONV_HIP_CPU) && defined(SPCONV_EMULATE_WMMA) && defined(SPCONV_EMULATE_MFMA)
#error "emulate one of WMMA and MFMA per build"
#elif defined(SPCONV_HIP_CPU) && defined(SPCONV_EMULATE_WMMA)
#include "emu/wmma_emu.h"
#define SPCONV_DEVICE_WMMA 1
#elif defined(SPCONV_HIP_CPU) && defined(SPCONV_EMULATE_MFMA)
#include "emu/mfma_emu.h"
#define SPCONV_DEVICE_MFMA 1
#endif
// T vector of n elements as the MFMA builtins take it: clang's ext_vector_type, or vector_size elsewhere.
#if defined(__clang__)
#define SPCONV_VECTOR(T, n) T __attribute__((ext_vector_type(n)))
#else
#define SPCONV_VECTOR(T, n) T __attribute__((vector_size((n) * sizeof(T))))
#endif

namespace spconv {
namespace gpu {

// ---- shuffles: HIP 5.2 has no *_sync forms; CUDA needs them ----
template <typename T>
__device__ __forceinline__ T shfl_down(T v, int delta) {
#if defined(SPCONV_HIP_CPU)
  // Lanes reversed: logical lane + delta is physical lane - delta (out of range keeps v, as __shfl_down does).
  if (thread_order::reversed()) return __shfl_up(v, delta);
  return __shfl_down(v, delta);
#elif defined(SPCONV_HIP)
  return __shfl_down(v, delta);
#else
  return __shfl_down_sync(0xffffffffu, v, delta);
#endif
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int d = SPCONV_WARP_SIZE / 2; d > 0; d >>= 1) v += shfl_down(v, d);
  return v;
}

// ---- bf16 held as raw bits: HIP 5.2 has no hip_bf16.h. Round to nearest even, NaN kept quiet ----
struct bf16_t {
  uint16_t x;
};

__host__ __device__ __forceinline__ float bf16_to_float(bf16_t v) {
  union { uint32_t u; float f; } c;
  c.u = static_cast<uint32_t>(v.x) << 16;
  return c.f;
}

__host__ __device__ __forceinline__ bf16_t float_to_bf16(float f) {
  union { uint32_t u; float f; } c;
  c.f = f;
  if ((c.u & 0x7fffffffu) > 0x7f800000u) return bf16_t{static_cast<uint16_t>((c.u >> 16) | 0x40u)};
  c.u += 0x7fffu + ((c.u >> 16) & 1u);
  return bf16_t{static_cast<uint16_t>(c.u >> 16)};
}

// ---- uniform conversions used by every kernel template ----
__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(bf16_t v) { return bf16_to_float(v); }
__device__ __forceinline__ double to_double(double v) { return v; }

template <typename T> __device__ __forceinline__ T from_float(float v);
template <> __device__ __forceinline__ float from_float<float>(float v) { return v; }
template <> __device__ __forceinline__ __half from_float<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ bf16_t from_float<bf16_t>(float v) { return float_to_bf16(v); }

// ---- atomicAdd on __half: a CAS loop on the enclosing 32-bit word (HIP 5.2 lacks it) ----
__device__ __forceinline__ void atomic_add_half(__half* addr, float val) {
  uintptr_t a = reinterpret_cast<uintptr_t>(addr);
  unsigned int* word = reinterpret_cast<unsigned int*>(a & ~uintptr_t{3});
  const bool high = (a & 2) != 0;
  unsigned int old = *word, assumed;
  do {
    assumed = old;
    unsigned short bits = high ? static_cast<unsigned short>(assumed >> 16) : static_cast<unsigned short>(assumed & 0xffffu);
    __half h;
    *reinterpret_cast<unsigned short*>(&h) = bits;
    h = __float2half_rn(__half2float(h) + val);
    unsigned short nb = *reinterpret_cast<unsigned short*>(&h);
    unsigned int next = high ? ((assumed & 0x0000ffffu) | (static_cast<unsigned int>(nb) << 16))
                             : ((assumed & 0xffff0000u) | nb);
    old = atomicCAS(word, assumed, next);
  } while (old != assumed);
}

// ---- launch helpers: never launch zero blocks; report errors as codes to the (torch-free) caller ----
constexpr int kMaxGridX = 1 << 20;  // grid-stride loops cover the rest

inline int grid_1d(int64_t work, int threads) {
  int64_t b = (work + threads - 1) / threads;
  return static_cast<int>(b < kMaxGridX ? b : kMaxGridX);
}

inline int last_launch_error() { return static_cast<int>(hipGetLastError()); }

#if defined(SPCONV_HIP_CPU)
// The launch ledger of the test build (launch_ledger.cu): one launch and the time its body ran.
void note_launch(int64_t body_ns);
#endif

// Every kernel launch goes through this one helper. The HIP CPU runtime has no <<<>>> and its null
// stream can reorder back-to-back launches, so there each launch is followed by a full synchronisation;
// there it is also counted, so that tests can hold the GPU code to a launch budget.
template <typename... Params, typename... Args>
inline void launch_kernel(void (*kernel)(Params...), dim3 grid, dim3 block, size_t shmem, hipStream_t stream,
                          Args&&... args) {
#if defined(SPCONV_HIP_CPU)
  const auto t0 = std::chrono::steady_clock::now();
  hipLaunchKernelGGL(kernel, grid, block, shmem, stream, std::forward<Args>(args)...);
  (void)hipDeviceSynchronize();
  note_launch(std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0).count());
#else
  kernel<<<grid, block, shmem, stream>>>(std::forward<Args>(args)...);
#endif
}

}  // namespace gpu
}  // namespace spconv

#define SPCONV_RETURN_IF_ERROR(expr)        \
  do {                                      \
    int spconv_err_ = static_cast<int>(expr); \
    if (spconv_err_ != 0) return spconv_err_; \
  } while (0)
