// Runs the WMMA emulator on tiles from the test: one block of two warps; warp w computes
// D_w = c0 + sum_s A_ws B_ws over `steps` steps from its own data.
// usage: wmma_emu_test f16|bf16|tf32|tf32-raw row|col row|col row|col steps ldm c0 in.bin out.bin
//   layouts of A, B (load) and D (store); in.bin: A [2][steps][16 * ldm] then B [2][steps][16 * ldm] raw 16-bit
//   (tf32: fp32; A 16 x 8, B 8 x 16, each in the first rows / columns of its region), each tile in its layout
//   with leading dimension ldm; out.bin: D [2][16 * ldm] fp32, NaN where not stored. tf32 converts the loaded
//   elements with __float_to_tf32 before each mma_sync; tf32-raw does not (the emulator must refuse them).
#include "hip_compat.h"

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#if !defined(SPCONV_DEVICE_WMMA)
#error "build with SPCONV_HIP_CPU and SPCONV_EMULATE_WMMA"
#endif

using namespace nvcuda;

template <typename MT, typename LA, typename LB>
__global__ void tile_kernel(const uint16_t* a, const uint16_t* b, int steps, int ldm, float c0, int store_col,
                            float* d) {
  const int warp = threadIdx.x / 32;
  const size_t tile = 16 * size_t(ldm);
  wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
  wmma::fill_fragment(acc, c0);
  for (int s = 0; s < steps; ++s) {
    wmma::fragment<wmma::matrix_a, 16, 16, 16, MT, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 16, MT, LB> fb;
    wmma::load_matrix_sync(fa, reinterpret_cast<const MT*>(a + (size_t(warp) * steps + s) * tile), ldm);
    wmma::load_matrix_sync(fb, reinterpret_cast<const MT*>(b + (size_t(warp) * steps + s) * tile), ldm);
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(d + warp * tile, acc, ldm, store_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <typename LA, typename LB>
__global__ void tf32_kernel(const float* a, const float* b, int steps, int ldm, float c0, int store_col, int convert,
                            float* d) {
  const int warp = threadIdx.x / 32;
  const size_t tile = 16 * size_t(ldm);
  wmma::fragment<wmma::accumulator, 16, 16, 8, float> acc;
  wmma::fill_fragment(acc, c0);
  for (int s = 0; s < steps; ++s) {
    wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, LA> fa;
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, LB> fb;
    wmma::load_matrix_sync(fa, a + (size_t(warp) * steps + s) * tile, ldm);
    wmma::load_matrix_sync(fb, b + (size_t(warp) * steps + s) * tile, ldm);
    if (convert) {
      for (int i = 0; i < fa.num_elements; ++i) fa.x[i] = wmma::__float_to_tf32(fa.x[i]);
      for (int i = 0; i < fb.num_elements; ++i) fb.x[i] = wmma::__float_to_tf32(fb.x[i]);
    }
    wmma::mma_sync(acc, fa, fb, acc);
  }
  wmma::store_matrix_sync(d + warp * tile, acc, ldm, store_col ? wmma::mem_col_major : wmma::mem_row_major);
}

template <typename LA, typename LB>
void launch_tf32(const float* a, const float* b, int steps, int ldm, float c0, int store_col, int convert, float* d) {
  hipLaunchKernelGGL((tf32_kernel<LA, LB>), dim3(1), dim3(64), 0, nullptr, a, b, steps, ldm, c0, store_col, convert,
                     d);
  (void)hipDeviceSynchronize();
}

void dispatch_tf32(bool a_col, bool b_col, const float* a, const float* b, int steps, int ldm, float c0,
                   int store_col, int convert, float* d) {
  if (!a_col && !b_col) launch_tf32<wmma::row_major, wmma::row_major>(a, b, steps, ldm, c0, store_col, convert, d);
  if (!a_col && b_col) launch_tf32<wmma::row_major, wmma::col_major>(a, b, steps, ldm, c0, store_col, convert, d);
  if (a_col && !b_col) launch_tf32<wmma::col_major, wmma::row_major>(a, b, steps, ldm, c0, store_col, convert, d);
  if (a_col && b_col) launch_tf32<wmma::col_major, wmma::col_major>(a, b, steps, ldm, c0, store_col, convert, d);
}

template <typename MT, typename LA, typename LB>
void launch(const uint16_t* a, const uint16_t* b, int steps, int ldm, float c0, int store_col, float* d) {
  hipLaunchKernelGGL((tile_kernel<MT, LA, LB>), dim3(1), dim3(64), 0, nullptr, a, b, steps, ldm, c0, store_col, d);
  (void)hipDeviceSynchronize();
}

template <typename MT>
void dispatch(bool a_col, bool b_col, const uint16_t* a, const uint16_t* b, int steps, int ldm, float c0,
              int store_col, float* d) {
  if (!a_col && !b_col) launch<MT, wmma::row_major, wmma::row_major>(a, b, steps, ldm, c0, store_col, d);
  if (!a_col && b_col) launch<MT, wmma::row_major, wmma::col_major>(a, b, steps, ldm, c0, store_col, d);
  if (a_col && !b_col) launch<MT, wmma::col_major, wmma::row_major>(a, b, steps, ldm, c0, store_col, d);
  if (a_col && b_col) launch<MT, wmma::col_major, wmma::col_major>(a, b, steps, ldm, c0, store_col, d);
}

int main(int argc, char** argv) {
  if (argc != 10) {
    std::fprintf(stderr, "usage: %s f16|bf16|tf32|tf32-raw row|col row|col row|col steps ldm c0 in.bin out.bin\n",
                 argv[0]);
    return 2;
  }
  const std::string type = argv[1];
  const bool bf16 = type == "bf16", tf32 = type.rfind("tf32", 0) == 0;
  const size_t elem = tf32 ? 4 : 2;
  const bool a_col = std::string(argv[2]) == "col", b_col = std::string(argv[3]) == "col";
  const int store_col = std::string(argv[4]) == "col";
  const int steps = std::atoi(argv[5]), ldm = std::atoi(argv[6]);
  const float c0 = std::strtof(argv[7], nullptr);
  const size_t tile = 16 * size_t(ldm), n_in = 2 * 2 * size_t(steps) * tile;
  // 64-byte aligned buffers: the emulator checks the documented 256-bit pointer alignment.
  unsigned char* in = static_cast<unsigned char*>(std::aligned_alloc(64, (n_in * elem + 63) / 64 * 64));
  float* d = static_cast<float*>(std::aligned_alloc(64, (2 * tile * 4 + 63) / 64 * 64));
  FILE* f = std::fopen(argv[8], "rb");
  if (!f || std::fread(in, elem, n_in, f) != n_in) return 3;
  std::fclose(f);
  for (size_t i = 0; i < 2 * tile; ++i) d[i] = NAN;
  const uint16_t* a = reinterpret_cast<const uint16_t*>(in);
  const uint16_t* b = a + 2 * size_t(steps) * tile;
  const float* fa = reinterpret_cast<const float*>(in);
  if (tf32)
    dispatch_tf32(a_col, b_col, fa, fa + 2 * size_t(steps) * tile, steps, ldm, c0, store_col, type == "tf32", d);
  else if (bf16)
    dispatch<__nv_bfloat16>(a_col, b_col, a, b, steps, ldm, c0, store_col, d);
  else
    dispatch<__half>(a_col, b_col, a, b, steps, ldm, c0, store_col, d);
  f = std::fopen(argv[9], "wb");
  if (!f || std::fwrite(d, 4, 2 * tile, f) != 2 * tile) return 3;
  std::fclose(f);
  return 0;
}
