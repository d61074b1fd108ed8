// Runs one block in the ascending or descending thread order of the HIP CPU build (csrc/hip/hip_cpu_thread_order.h)
// and writes, per logical thread: the position at which it ran (an atomic counter before its first barrier),
// its logical (x, y, z), and warp_sum of (logical linear id + 1) over its wavefront.
// usage: thread_order_test ascending|descending bx by bz out.bin   (out.bin: int32 [threads][6])
#include "hip_compat.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

__global__ void order_kernel(int* counter, int* out) {
  const unsigned id = threadIdx.x + blockDim.x * (threadIdx.y + blockDim.y * threadIdx.z);
  const int ran = atomicAdd(counter, 1);  // before any barrier: the order the runtime ran the logical threads in
  __syncthreads();
  const int sum = spconv::gpu::warp_sum(static_cast<int>(id) + 1);
  int* o = out + id * 6;
  o[0] = ran;
  o[1] = static_cast<int>(threadIdx.x);
  o[2] = static_cast<int>(threadIdx.y);
  o[3] = static_cast<int>(threadIdx.z);
  o[4] = sum;
  o[5] = 1;  // written: each logical id appears once
}

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: %s ascending|descending bx by bz out.bin\n", argv[0]);
    return 2;
  }
  spconv::gpu::thread_order::descending_flag() = std::strcmp(argv[1], "descending") == 0;
  const dim3 block(std::atoi(argv[2]), std::atoi(argv[3]), std::atoi(argv[4]));
  const size_t n = size_t(block.x) * block.y * block.z;
  std::vector<int> out(n * 6, 0);
  int counter = 0;
  hipLaunchKernelGGL(order_kernel, dim3(1), block, 0, nullptr, &counter, out.data());
  (void)hipDeviceSynchronize();
  FILE* f = std::fopen(argv[5], "wb");
  if (!f || std::fwrite(out.data(), 4, out.size(), f) != out.size()) return 3;
  std::fclose(f);
  return 0;
}
