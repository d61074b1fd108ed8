// Symmetric int8 convolution over a neighbour table (the quantized_conv op, see schema.cpp), output-stationary:
// each output row sums its table columns exactly in int32, then the FP32 epilogue (every operation rounded on
// its own) requantizes it to int8, written once. Integer sums don't depend on their order, so the bits are the
// same for every body and thread count. Three bodies, picked at run time (SPCONV_CPU_ISA caps the choice):
// AVX-512 VNNI, AVX2 (exact 16-bit multiply-adds) and portable C++.
#pragma once
#include <cstdint>

#include "simd.h"

namespace spconv {
namespace native {

struct Int8Conv {
  const int8_t* x = nullptr;  // [num_in, cin]
  int64_t num_in = 0, cin = 0;
  const int8_t* w = nullptr;  // [kvol, cin, cout]
  int64_t kvol = 1, cout = 0;
  const int32_t* nbr = nullptr;  // [num_out, cols]: column j feeds through w[j % kvol]; -1 = none
  int64_t num_out = 0, cols = 0;
  const float* scale = nullptr;     // [cout]
  const float* bias = nullptr;      // [cout] or null
  const int8_t* residual = nullptr;  // [num_out, cout] or null
  float residual_scale = 0.f;
  int activation = 0;  // 0 none, 1 ReLU, 2 LeakyReLU
  float alpha = 0.f;
  int8_t* out = nullptr;  // [num_out, cout]
};

enum class Int8Path { kGeneric = 0, kAvx2 = 1, kAvx512Vnni = 2 };

// The body int8_conv runs on this CPU under the SPCONV_CPU_ISA cap (inline: build_info reports it in every
// build of the op glue, with or without the kernels).
inline Int8Path int8_conv_path() {
  if (cpu_has_avx512_vnni()) return Int8Path::kAvx512Vnni;
  if (cpu_has_avx2_fma()) return Int8Path::kAvx2;
  return Int8Path::kGeneric;
}

inline const char* int8_path_name(Int8Path p) {
  switch (p) {
    case Int8Path::kAvx512Vnni: return "avx512_vnni";
    case Int8Path::kAvx2: return "avx2";
    default: return "generic";
  }
}

// Computes a.out. Returns false when nbr holds an entry outside [-1, num_in): such entries are skipped (never
// read through) and the caller reports the error.
bool int8_conv(const Int8Conv& a);

// The bodies, for int8_conv's dispatch (each only where its instructions exist).
bool int8_conv_generic(const Int8Conv& a);
bool int8_conv_avx2(const Int8Conv& a);
bool int8_conv_avx512_vnni(const Int8Conv& a);

}  // namespace native
}  // namespace spconv
