// Runs the MFMA emulator on per-lane operands from the test: one block of `threads` threads (waves of 64);
// lane l of wave w starts from C[w][l] and calls the builtin once per step with A[w][s][l], B[w][s][l].
// The test places matrix elements in lanes itself, so the documented lane layout is checked from outside.
// usage: mfma_emu_test f16|bf16|i8 threads steps cbsz in.bin out.bin
//   in.bin: A [waves][steps][64][4] raw 16-bit, B likewise, C [waves][64][4] fp32; out.bin: D [waves][64][4] fp32.
//   i8 (v_mfma_i32_16x16x16i8): the low byte of each 16-bit element is the int8 value (element i goes to byte i
//   of the lane's operand word); C and D are integers carried in fp32 (exact below 2^24).
#include "hip_compat.h"

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#if !defined(SPCONV_DEVICE_MFMA)
#error "build with SPCONV_HIP_CPU and SPCONV_EMULATE_MFMA"
#endif

typedef SPCONV_VECTOR(_Float16, 4) half4;
typedef SPCONV_VECTOR(short, 4) short4_t;
typedef SPCONV_VECTOR(float, 4) float4_t;
typedef SPCONV_VECTOR(int, 4) int4_t;

__global__ void lanes_kernel_i8(const uint16_t* a, const uint16_t* b, const float* c, int steps, int cbsz, float* d) {
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64;
  int4_t acc;
  for (int i = 0; i < 4; ++i) acc[i] = static_cast<int>(c[(wave * 64 + lane) * 4 + i]);
  for (int s = 0; s < steps; ++s) {
    uint32_t av = 0, bv = 0;
    for (int i = 0; i < 4; ++i) {
      av |= uint32_t(a[((size_t(wave) * steps + s) * 64 + lane) * 4 + i] & 0xffu) << (8 * i);
      bv |= uint32_t(b[((size_t(wave) * steps + s) * 64 + lane) * 4 + i] & 0xffu) << (8 * i);
    }
    acc = __builtin_amdgcn_mfma_i32_16x16x16i8(static_cast<int>(av), static_cast<int>(bv), acc, cbsz, 0, 0);
  }
  for (int i = 0; i < 4; ++i) d[(wave * 64 + lane) * 4 + i] = static_cast<float>(acc[i]);
}

template <bool kBf16>
__global__ void lanes_kernel(const uint16_t* a, const uint16_t* b, const float* c, int steps, int cbsz, float* d) {
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64;
  float4_t acc;
  for (int i = 0; i < 4; ++i) acc[i] = c[(wave * 64 + lane) * 4 + i];
  for (int s = 0; s < steps; ++s) {
    short4_t av, bv;
    for (int i = 0; i < 4; ++i) {
      av[i] = static_cast<short>(a[((size_t(wave) * steps + s) * 64 + lane) * 4 + i]);
      bv[i] = static_cast<short>(b[((size_t(wave) * steps + s) * 64 + lane) * 4 + i]);
    }
    if constexpr (kBf16) {
      acc = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, acc, cbsz, 0, 0);
    } else {
      half4 ah, bh;
      __builtin_memcpy(&ah, &av, sizeof ah);
      __builtin_memcpy(&bh, &bv, sizeof bh);
      acc = __builtin_amdgcn_mfma_f32_16x16x16f16(ah, bh, acc, cbsz, 0, 0);
    }
  }
  for (int i = 0; i < 4; ++i) d[(wave * 64 + lane) * 4 + i] = acc[i];
}

int main(int argc, char** argv) {
  if (argc != 7) {
    std::fprintf(stderr, "usage: %s f16|bf16|i8 threads steps cbsz in.bin out.bin\n", argv[0]);
    return 2;
  }
  const bool bf16 = std::string(argv[1]) == "bf16";
  const int threads = std::atoi(argv[2]), steps = std::atoi(argv[3]), cbsz = std::atoi(argv[4]);
  const int waves = (threads + 63) / 64;
  const size_t n_ab = size_t(waves) * steps * 256, n_c = size_t(waves) * 256;
  std::vector<uint16_t> a(n_ab), b(n_ab);
  std::vector<float> c(n_c), d(n_c, 0.f);
  FILE* f = std::fopen(argv[5], "rb");
  if (!f || std::fread(a.data(), 2, n_ab, f) != n_ab || std::fread(b.data(), 2, n_ab, f) != n_ab ||
      std::fread(c.data(), 4, n_c, f) != n_c)
    return 3;
  std::fclose(f);
  if (std::string(argv[1]) == "i8")
    hipLaunchKernelGGL(lanes_kernel_i8, dim3(1), dim3(threads), 0, nullptr, a.data(), b.data(), c.data(), steps,
                       cbsz, d.data());
  else if (bf16)
    hipLaunchKernelGGL(lanes_kernel<true>, dim3(1), dim3(threads), 0, nullptr, a.data(), b.data(), c.data(), steps,
                       cbsz, d.data());
  else
    hipLaunchKernelGGL(lanes_kernel<false>, dim3(1), dim3(threads), 0, nullptr, a.data(), b.data(), c.data(), steps,
                       cbsz, d.data());
  (void)hipDeviceSynchronize();
  f = std::fopen(argv[6], "wb");
  if (!f || std::fwrite(d.data(), 4, n_c, f) != n_c) return 3;
  std::fclose(f);
  return 0;
}
