// Runs the integer MMA emulator (csrc/hip/emu/mma_s8_emu.h, through int8_dot.h's mma_s8_16x8x32) on per-lane
// registers from the test: one block of `threads` threads (warps of 32); lane l of warp w calls it once with
// A[w][l], B[w][l], C[w][l]. The test places matrix elements in lanes itself, so the layout is checked from outside.
// usage: mma_s8_emu_test threads in.bin out.bin
//   in.bin: A [warps][32][4] uint32, B [warps][32][2] uint32, C [warps][32][4] int32; out.bin: D like C.
#include "hip_compat.h"

#include <cstdio>
#include <cstdlib>
#include <vector>

#include "int8_dot.h"

#if !defined(SPCONV_INT8_MMA)
#error "build with SPCONV_HIP_CPU and SPCONV_EMULATE_WMMA"
#endif

__global__ void lanes_kernel(const uint32_t* a, const uint32_t* b, const int32_t* c, int32_t* d) {
  const int l = threadIdx.x;
  const uint32_t av[4] = {a[l * 4], a[l * 4 + 1], a[l * 4 + 2], a[l * 4 + 3]};
  const uint32_t bv[2] = {b[l * 2], b[l * 2 + 1]};
  int32_t acc[4] = {c[l * 4], c[l * 4 + 1], c[l * 4 + 2], c[l * 4 + 3]};
  spconv::gpu::mma_s8_16x8x32(av, bv, acc);
  for (int i = 0; i < 4; ++i) d[l * 4 + i] = acc[i];
}

int main(int argc, char** argv) {
  if (argc != 4) {
    std::fprintf(stderr, "usage: %s threads in.bin out.bin\n", argv[0]);
    return 2;
  }
  const int threads = std::atoi(argv[1]);
  const size_t n = size_t(threads);
  std::vector<uint32_t> a(n * 4), b(n * 2);
  std::vector<int32_t> c(n * 4), d(n * 4, 0);
  FILE* f = std::fopen(argv[2], "rb");
  if (!f || std::fread(a.data(), 4, a.size(), f) != a.size() || std::fread(b.data(), 4, b.size(), f) != b.size() ||
      std::fread(c.data(), 4, c.size(), f) != c.size())
    return 3;
  std::fclose(f);
  hipLaunchKernelGGL(lanes_kernel, dim3(1), dim3(threads), 0, nullptr, a.data(), b.data(), c.data(), d.data());
  (void)hipDeviceSynchronize();
  f = std::fopen(argv[3], "wb");
  if (!f || std::fwrite(d.data(), 4, d.size(), f) != d.size()) return 3;
  std::fclose(f);
  return 0;
}
