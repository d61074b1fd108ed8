// nvcuda::wmma for the HIP-CPU build (host compiler + HIP CPU runtime), so that the WMMA bodies of
// fused_conv.cu run in tests without an NVIDIA GPU. Included by hip_compat.h when SPCONV_EMULATE_WMMA is set;
// never part of an nvcc or hipcc build.
//
// Written from the CUDA C++ Programming Guide, section "Warp Matrix Functions" (nvcuda::wmma, <mma.h>). Reproduced:
//  * fragment<matrix_a | matrix_b, 16, 16, 16, __half | __nv_bfloat16, row_major | col_major> and
//    fragment<accumulator, 16, 16, 16, float>; fill_fragment (accumulator), load_matrix_sync (operands), mma_sync
//    (D = A * B + C, fp32 accumulation) and store_matrix_sync (accumulator, mem_row_major / mem_col_major).
//  * The same for TF32: fragment<matrix_a, 16, 16, 8, precision::tf32, ...> (16 x 8), <matrix_b, 16, 16, 8, ...>
//    (8 x 16), loaded from float, and fragment<accumulator, 16, 16, 8, float>; element access (num_elements,
//    x[]) of the operand fragments, and __float_to_tf32 (cvt.rna.tf32.f32: to 10 mantissa bits, to nearest,
//    ties away from zero). mma_sync requires operands that __float_to_tf32 made (the low 13 bits clear:
//    checked, abort), whose products are exact in fp32.
//  * Warps are 32 consecutive linear thread ids, as on NVIDIA (not HIP-CPU's 64-wide wavefront).
//  * The element-to-thread mapping of a fragment is unspecified: here an operand fragment holds its whole
//    tile in every lane, and lane l owns accumulator elements e = l + 32 t (t < 8, e = row * 16 + col).
//    mma_sync therefore needs no cross-lane data, and a store needs all 32 lanes of the warp: a store that
//    some lanes skip (undefined on the hardware) leaves holes in the tile.
//  * Documented preconditions are checked (abort with a message): pointers 256-bit aligned, ldm a multiple
//    of 8 elements for 16-bit types and of 4 for float.
// Not reproduced:
//  * The order and intermediate rounding of the K-sum inside mma_sync, which CUDA leaves unspecified. Here
//    each product of two fp16/bf16 values is exact in fp32, and the 16 products are added to the
//    accumulator one at a time in k order, each add rounded to nearest even in fp32 (so FMA contraction
//    cannot change the result). Subnormals are kept; NaN and Inf follow IEEE.
//  * That every lane of the warp calls with the same arguments (undefined behaviour in CUDA) is not checked.
//  * Other shapes and types, element access of the 16-bit and accumulator fragments, accumulator loads,
//    satfinite, int.
#pragma once

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <type_traits>

#ifndef __align__
#define __align__(n) __attribute__((aligned(n)))
#endif

// cuda_bf16.h's type, held as raw bits (only ever read through fragments here).
struct __nv_bfloat16 {
  uint16_t x;
};

namespace nvcuda {
namespace wmma {

struct matrix_a {};
struct matrix_b {};
namespace precision {
struct tf32 {};
}  // namespace precision
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

namespace emu {

constexpr int kWarp = 32;

[[noreturn]] inline void fail(const char* what) {
  std::fprintf(stderr, "wmma emulation: %s\n", what);
  std::abort();
}

inline int lane() {
  const unsigned linear = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  return static_cast<int>(linear % kWarp);
}

inline void check_ptr(const void* p, unsigned ldm, unsigned multiple) {
  if (reinterpret_cast<uintptr_t>(p) % 32 != 0) fail("pointer not 256-bit aligned");
  if (ldm % multiple != 0) fail("ldm not a multiple of 16 bytes");
}

// Exact widening of the stored bits.
inline float to_float(uint16_t bits, const __nv_bfloat16*) {
  const uint32_t u = static_cast<uint32_t>(bits) << 16;
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline float to_float(uint16_t bits, const __half*) {
  const uint32_t sign = (bits & 0x8000u) << 16;
  uint32_t exp = (bits >> 10) & 0x1fu, man = bits & 0x3ffu, u;
  if (exp == 0x1fu) {
    u = sign | 0x7f800000u | (man << 13);  // Inf / NaN
  } else if (exp != 0) {
    u = sign | ((exp + 112u) << 23) | (man << 13);
  } else if (man == 0) {
    u = sign;
  } else {  // subnormal: normalise
    int e = -1;
    do {
      man <<= 1;
      ++e;
    } while ((man & 0x400u) == 0);
    u = sign | ((112u - e) << 23) | ((man & 0x3ffu) << 13);
  }
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

template <typename T>
constexpr bool is_operand_type = std::is_same<T, __half>::value || std::is_same<T, __nv_bfloat16>::value;

}  // namespace emu

template <typename Use, int M, int N, int K, typename T, typename Layout = void>
class fragment;

// matrix_a is the M x K tile, matrix_b the K x N tile; bits[r][c] in logical order, whatever the memory
// layout. Raw bits, not floats: a HIP-CPU fiber has a stack of about 7 KiB.
template <typename Use, typename T, typename Layout>
class fragment<Use, 16, 16, 16, T, Layout> {
  static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value, "operand fragment");
  static_assert(emu::is_operand_type<T>, "fp16 / bf16 operands only");
  static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value, "layout");

 public:
  uint16_t bits[16][16];
};

template <>
class fragment<accumulator, 16, 16, 16, float, void> {
 public:
  float own[8];  // element lane + 32 t
};

inline void fill_fragment(fragment<accumulator, 16, 16, 16, float>& f, float value) {
  for (float& e : f.own) e = value;
}

template <typename Use, typename T, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 16, T, Layout>& f, const T* p, unsigned ldm) {
  emu::check_ptr(p, ldm, 8);
  const uint16_t* src = reinterpret_cast<const uint16_t*>(p);
  constexpr bool row = std::is_same<Layout, row_major>::value;
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 16; ++c) f.bits[r][c] = src[row ? r * ldm + c : c * ldm + r];
}

template <typename T, typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 16, float>& d, const fragment<matrix_a, 16, 16, 16, T, LA>& a,
                     const fragment<matrix_b, 16, 16, 16, T, LB>& b,
                     const fragment<accumulator, 16, 16, 16, float>& c) {
  const T* type = nullptr;
  const int l = emu::lane();
  for (int t = 0; t < 8; ++t) {
    const int e = l + emu::kWarp * t, r = e / 16, n = e % 16;
    float s = c.own[t];
    for (int k = 0; k < 16; ++k) s += emu::to_float(a.bits[r][k], type) * emu::to_float(b.bits[k][n], type);
    d.own[t] = s;  // d may be c: element t was read above
  }
}

template <int K>
inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, K, float>& f, unsigned ldm,
                              layout_t layout) {
  emu::check_ptr(p, ldm, 4);
  const int l = emu::lane();
  for (int t = 0; t < 8; ++t) {
    const int e = l + emu::kWarp * t, r = e / 16, n = e % 16;
    p[layout == mem_row_major ? r * ldm + n : n * ldm + r] = f.own[t];
  }
}

// ---- TF32: m16n16k8 ----

// cvt.rna.tf32.f32; Inf and NaN pass unchanged, a value rounding past the largest finite one becomes Inf.
inline float __float_to_tf32(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  if ((u & 0x7f800000u) != 0x7f800000u) u = (u + 0x1000u) & ~0x1fffu;  // half an ulp of tf32 on the magnitude
  std::memcpy(&v, &u, sizeof v);
  return v;
}

// matrix_a: the 16 x 8 tile, matrix_b: the 8 x 16 tile; x[] in logical row-major order of the tile.
template <typename Use, typename Layout>
class fragment<Use, 16, 16, 8, precision::tf32, Layout> {
  static_assert(std::is_same<Use, matrix_a>::value || std::is_same<Use, matrix_b>::value, "operand fragment");
  static_assert(std::is_same<Layout, row_major>::value || std::is_same<Layout, col_major>::value, "layout");

 public:
  static constexpr int kRows = std::is_same<Use, matrix_a>::value ? 16 : 8;
  static constexpr int kCols = std::is_same<Use, matrix_a>::value ? 8 : 16;
  static constexpr int num_elements = kRows * kCols;
  float x[num_elements];
};

template <>
class fragment<accumulator, 16, 16, 8, float, void> {
 public:
  float own[8];  // element lane + 32 t
};

inline void fill_fragment(fragment<accumulator, 16, 16, 8, float>& f, float value) {
  for (float& e : f.own) e = value;
}

template <typename Use, typename Layout>
inline void load_matrix_sync(fragment<Use, 16, 16, 8, precision::tf32, Layout>& f, const float* p, unsigned ldm) {
  using F = fragment<Use, 16, 16, 8, precision::tf32, Layout>;
  emu::check_ptr(p, ldm, 4);
  constexpr bool row = std::is_same<Layout, row_major>::value;
  for (int r = 0; r < F::kRows; ++r)
    for (int c = 0; c < F::kCols; ++c) f.x[r * F::kCols + c] = p[row ? r * ldm + c : c * ldm + r];
}

namespace emu {
inline float tf32_operand(float v) {
  uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  if ((u & 0x1fffu) != 0 && (u & 0x7f800000u) != 0x7f800000u) fail("tf32 operand not made by __float_to_tf32");
  return v;
}
}  // namespace emu

template <typename LA, typename LB>
inline void mma_sync(fragment<accumulator, 16, 16, 8, float>& d,
                     const fragment<matrix_a, 16, 16, 8, precision::tf32, LA>& a,
                     const fragment<matrix_b, 16, 16, 8, precision::tf32, LB>& b,
                     const fragment<accumulator, 16, 16, 8, float>& c) {
  const int l = emu::lane();
  for (int t = 0; t < 8; ++t) {
    const int e = l + emu::kWarp * t, r = e / 16, n = e % 16;
    float s = c.own[t];
    for (int k = 0; k < 8; ++k) s += emu::tf32_operand(a.x[r * 8 + k]) * emu::tf32_operand(b.x[k * 16 + n]);
    d.own[t] = s;  // d may be c: element t was read above
  }
}

}  // namespace wmma
}  // namespace nvcuda
