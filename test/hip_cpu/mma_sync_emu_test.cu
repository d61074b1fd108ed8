// Runs the sm_80 instruction emulators (csrc/hip/emu/{mma_sync,ldmatrix,cp_async}_emu.h, through tc_sm80.h) on
// data from the test, which places and reads matrix elements per lane itself, so layouts are checked from outside.
// usage:
//   mma_sync_emu_test mma f16|bf16 warps steps in.bin out.bin
//     in: A [warps][steps][32][4] u32, B [warps][steps][32][2] u32, C [warps][32][4] f32; out: D like C.
//     Lane l of warp w starts from C[w][l] and issues `steps` MMAs in order.
//   mma_sync_emu_test ldmatrix N trans warps rows in.bin out.bin
//     in: rows of 8 u16 [warps][rows][8], row index per lane [warps][32] i32 (-1: an unusable address);
//     out: registers [warps][32][N] u32.
//   mma_sync_emu_test cp_async_groups n in.bin out.bin     (one block of n threads, see groups_kernel)
//   mma_sync_emu_test cp_async_ring n chunks lag barrier in.bin out.bin   (see ring_kernel)
//   mma_sync_emu_test cp_async_bad what                     (misaligned / wrong size: must abort)
//   mma_sync_emu_test vote warps in.bin out.bin
//     in: a predicate per thread [warps][32] i32; out: warp_any's result per thread [warps][32] i32.
#include "hip_compat.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "tc_sm80.h"

#if !defined(SPCONV_DEVICE_SM80)
#error "build with SPCONV_HIP_CPU and SPCONV_EMULATE_SM80"
#endif

using namespace spconv::gpu;

template <typename T>
__global__ void mma_kernel(const uint32_t* a, const uint32_t* b, const float* c, float* d, int steps) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  float acc[4];
  for (int i = 0; i < 4; ++i) acc[i] = c[(w * 32 + l) * 4 + i];
  for (int s = 0; s < steps; ++s) {
    const uint32_t* ap = a + ((size_t(w) * steps + s) * 32 + l) * 4;
    const uint32_t* bp = b + ((size_t(w) * steps + s) * 32 + l) * 2;
    const uint32_t av[4] = {ap[0], ap[1], ap[2], ap[3]};
    const uint32_t bv[2] = {bp[0], bp[1]};
    tc::mma_m16n8k16<T>(acc, av, bv);
  }
  for (int i = 0; i < 4; ++i) d[(w * 32 + l) * 4 + i] = acc[i];
}

constexpr int kMaxRows = 64;  // rows per warp in shared memory

template <int N, bool Trans>
__global__ void ldmatrix_kernel(const uint16_t* rows, const int32_t* index, int nrows, uint32_t* out) {
  __shared__ __attribute__((aligned(16))) uint16_t smem[4][kMaxRows][8];
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  if (l == 0)
    for (int r = 0; r < nrows; ++r) std::memcpy(smem[w][r], rows + (size_t(w) * nrows + r) * 8, 16);
  __syncthreads();
  const int i = index[w * 32 + l];
  const void* p = i >= 0 ? static_cast<const void*>(smem[w][i]) : reinterpret_cast<const void*>(uintptr_t(3));
  uint32_t r[N];
  tc::ldmatrix<N, Trans>(r, p);
  for (int k = 0; k < N; ++k) out[(w * 32 + l) * N + k] = r[k];
}

// Thread t: 16 bytes of src0 -> s0 (group 0), 8 bytes with src-size 4 of src1 -> s1 (group 1), 4 bytes with
// src-size 0 -> s2 (not committed), recording its own destinations (7 words) after each step:
// 0 issue, 1 wait_group 1, 2 wait_group 0, 3 wait_all; then 4: after a barrier, thread (t + 1) % n's s0 words.
constexpr int kRecWords = 7, kRecs = 5;

__global__ void groups_kernel(const uint32_t* src0, const uint32_t* src1, uint32_t* out) {
  __shared__ __attribute__((aligned(16))) uint32_t s0[256][4];
  __shared__ __attribute__((aligned(16))) uint32_t s1[256][2];
  __shared__ __attribute__((aligned(16))) uint32_t s2[256];
  const int t = threadIdx.x, n = blockDim.x;
  uint32_t* rec = out + size_t(t) * kRecs * kRecWords;
  auto record = [&](int step, const uint32_t* w4) {
    uint32_t* o = rec + step * kRecWords;
    for (int i = 0; i < 4; ++i) o[i] = w4[i];
    o[4] = s1[t][0];
    o[5] = s1[t][1];
    o[6] = s2[t];
  };
  tc::cp_async<16>(s0[t], src0 + t * 4, 16);
  tc::cp_async_commit();
  tc::cp_async<8>(s1[t], src1 + t * 2, 4);
  tc::cp_async_commit();
  tc::cp_async<4>(&s2[t], src1, 0);
  record(0, s0[t]);
  tc::cp_async_wait_group<1>();
  record(1, s0[t]);
  tc::cp_async_wait_group<0>();
  record(2, s0[t]);
  tc::cp_async_wait_all();
  record(3, s0[t]);
  __syncthreads();
  record(4, s0[(t + 1) % n]);
}

// A 3-stage pipeline as the fused body runs it: chunk c (n x 4 words, one 16-byte copy per thread) goes to
// stage c % 3, issued two chunks ahead; before reading chunk c each thread waits for all but its newest `lag`
// groups (1 is right) and, with `barrier`, passes a block barrier. Thread t adds word (4t + 5) % (4n) of every
// chunk, a word another thread copied.
template <int Lag>
__global__ void ring_kernel(const uint32_t* src, int chunks, int barrier, uint64_t* out) {
  constexpr int S = 3;
  __shared__ __attribute__((aligned(16))) uint32_t stage[S][256 * 4];
  const int t = threadIdx.x, n = blockDim.x;
  for (int s = 0; s < S - 1; ++s) {
    if (s < chunks) tc::cp_async<16>(&stage[s][t * 4], src + (size_t(s) * n + t) * 4, 16);
    tc::cp_async_commit();
  }
  uint64_t sum = 0;
  for (int c = 0; c < chunks; ++c) {
    tc::cp_async_wait_group<Lag>();
    if (barrier) __syncthreads();
    sum += stage[c % S][(4 * t + 5) % (4 * n)];
    const int next = c + S - 1;
    if (next < chunks) tc::cp_async<16>(&stage[next % S][t * 4], src + (size_t(next) * n + t) * 4, 16);
    tc::cp_async_commit();
  }
  tc::cp_async_wait_all();
  out[t] = sum;
}

__global__ void bad_kernel(int what, const uint32_t* src) {
  __shared__ __attribute__((aligned(16))) uint32_t s[8];
  if (what == 0) tc::cp_async<16>(&s[1], src, 16);          // destination not 16-byte aligned
  if (what == 1) tc::cp_async<8>(&s[0], src + 1, 8);        // source not 8-byte aligned
  if (what == 2) tc::cp_async<4>(&s[0], src, 8);            // src-size over cp-size
  tc::cp_async_wait_all();
}

__global__ void vote_kernel(const int32_t* p, int32_t* out) {
  out[threadIdx.x] = tc::warp_any(p[threadIdx.x] != 0) ? 1 : 0;
}

namespace {

template <typename V>
bool read_file(FILE* f, std::vector<V>& v) {
  return std::fread(v.data(), sizeof(V), v.size(), f) == v.size();
}

template <typename V>
int write_out(const char* path, const std::vector<V>& v) {
  FILE* f = std::fopen(path, "wb");
  if (!f || std::fwrite(v.data(), sizeof(V), v.size(), f) != v.size()) return 3;
  std::fclose(f);
  return 0;
}

template <typename K, typename... Args>
void launch(K kernel, int threads, Args... args) {
  hipLaunchKernelGGL(kernel, dim3(1), dim3(threads), 0, nullptr, args...);
  (void)hipDeviceSynchronize();
}

int run_mma(int argc, char** argv) {
  if (argc != 7) return 2;
  const bool bf16 = std::string(argv[2]) == "bf16";
  const int warps = std::atoi(argv[3]), steps = std::atoi(argv[4]);
  std::vector<uint32_t> a(size_t(warps) * steps * 32 * 4), b(size_t(warps) * steps * 32 * 2);
  std::vector<float> c(size_t(warps) * 32 * 4), d(c.size());
  FILE* f = std::fopen(argv[5], "rb");
  if (!f || !read_file(f, a) || !read_file(f, b) || !read_file(f, c)) return 3;
  std::fclose(f);
  if (bf16)
    launch(mma_kernel<bf16_t>, 32 * warps, a.data(), b.data(), c.data(), d.data(), steps);
  else
    launch(mma_kernel<__half>, 32 * warps, a.data(), b.data(), c.data(), d.data(), steps);
  return write_out(argv[6], d);
}

template <int N>
void launch_ldmatrix(bool trans, int warps, const uint16_t* rows, const int32_t* index, int nrows, uint32_t* out) {
  if (trans)
    launch(ldmatrix_kernel<N, true>, 32 * warps, rows, index, nrows, out);
  else
    launch(ldmatrix_kernel<N, false>, 32 * warps, rows, index, nrows, out);
}

int run_ldmatrix(int argc, char** argv) {
  if (argc != 8) return 2;
  const int n = std::atoi(argv[2]), trans = std::atoi(argv[3]), warps = std::atoi(argv[4]), nrows = std::atoi(argv[5]);
  if (warps > 4 || nrows > kMaxRows) return 2;
  std::vector<uint16_t> rows(size_t(warps) * nrows * 8);
  std::vector<int32_t> index(size_t(warps) * 32);
  std::vector<uint32_t> out(size_t(warps) * 32 * n);
  FILE* f = std::fopen(argv[6], "rb");
  if (!f || !read_file(f, rows) || !read_file(f, index)) return 3;
  std::fclose(f);
  if (n == 1) launch_ldmatrix<1>(trans, warps, rows.data(), index.data(), nrows, out.data());
  else if (n == 2) launch_ldmatrix<2>(trans, warps, rows.data(), index.data(), nrows, out.data());
  else if (n == 4) launch_ldmatrix<4>(trans, warps, rows.data(), index.data(), nrows, out.data());
  else return 2;
  return write_out(argv[7], out);
}

int run_groups(int argc, char** argv) {
  if (argc != 5) return 2;
  const int n = std::atoi(argv[2]);
  if (n > 256) return 2;
  std::vector<uint32_t> src0(size_t(n) * 4), src1(size_t(n) * 2), out(size_t(n) * kRecs * kRecWords);
  FILE* f = std::fopen(argv[3], "rb");
  if (!f || !read_file(f, src0) || !read_file(f, src1)) return 3;
  std::fclose(f);
  launch(groups_kernel, n, static_cast<const uint32_t*>(src0.data()), static_cast<const uint32_t*>(src1.data()),
         out.data());
  return write_out(argv[4], out);
}

int run_vote(int argc, char** argv) {
  if (argc != 5) return 2;
  const int warps = std::atoi(argv[2]);
  if (warps < 1 || warps > 8) return 2;
  std::vector<int32_t> p(size_t(warps) * 32), out(p.size());
  FILE* f = std::fopen(argv[3], "rb");
  if (!f || !read_file(f, p)) return 3;
  std::fclose(f);
  launch(vote_kernel, 32 * warps, static_cast<const int32_t*>(p.data()), out.data());
  return write_out(argv[4], out);
}

int run_ring(int argc, char** argv) {
  if (argc != 8) return 2;
  const int n = std::atoi(argv[2]), chunks = std::atoi(argv[3]), lag = std::atoi(argv[4]), barrier = std::atoi(argv[5]);
  if (n > 256) return 2;
  std::vector<uint32_t> src(size_t(chunks) * n * 4);
  std::vector<uint64_t> out(n);
  FILE* f = std::fopen(argv[6], "rb");
  if (!f || !read_file(f, src)) return 3;
  std::fclose(f);
  const uint32_t* s = src.data();
  if (lag == 0) launch(ring_kernel<0>, n, s, chunks, barrier, out.data());
  else if (lag == 1) launch(ring_kernel<1>, n, s, chunks, barrier, out.data());
  else if (lag == 2) launch(ring_kernel<2>, n, s, chunks, barrier, out.data());
  else return 2;
  return write_out(argv[7], out);
}

}  // namespace

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  int rc = 2;
  if (mode == "mma") rc = run_mma(argc, argv);
  else if (mode == "ldmatrix") rc = run_ldmatrix(argc, argv);
  else if (mode == "cp_async_groups") rc = run_groups(argc, argv);
  else if (mode == "cp_async_ring") rc = run_ring(argc, argv);
  else if (mode == "vote") rc = run_vote(argc, argv);
  else if (mode == "cp_async_bad" && argc == 3) {
    std::vector<uint32_t> src(16, 1u);
    launch(bad_kernel, 1, std::atoi(argv[2]), static_cast<const uint32_t*>(src.data()));
    rc = 0;
  }
  if (rc == 2) std::fprintf(stderr, "usage: see the head of mma_sync_emu_test.cu\n");
  return rc;
}
