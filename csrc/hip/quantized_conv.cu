// int8 sparse convolution over a neighbour table (schema.cpp, int8 section), output-stationary: a block owns a
// tile of kRows output rows x kCols output channels, walks the table's T columns in order, gathers the int8
// input rows of the present neighbours into shared memory as 4-byte words (4 input channels each), multiplies
// them with the column's filter slice by packed int8 dot products into int32 registers (int8_dot.h) and
// writes each output once through the FP32 epilogue: deterministic, no atomics.
// Operands come packed by the glue: x [n_in, k4] and w [kvol, k4, cout] int32 words of 4 int8 along Cin
// (zero-padded), so every load is one aligned word and channel tails need no special case along Cin.
// Bodies (int8_dot.h): matrix cores where the target has them: int8 MFMA (gfx90a, gfx94x; emulated in the HIP
// CPU mfma variant) or integer mma.sync (NVIDIA sm_80+; emulated in the wmma variant); else per-thread packed
// dot products (sdot4, dp4a, or plain C). Integer sums are exact in any
// order, so every body gives the same bits.
#include "hip_compat.h"

#include "exact_math.h"
#include "int8_dot.h"
#include "launchers.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int kThreads = 256;
constexpr int kRows = 32;   // output rows per tile
constexpr int kCols = 64;   // output channels per tile
constexpr int kWords = 16;  // words (64 input channels) per K step

struct QArgs {
  const int32_t* x;        // [n_in, k4]
  const int32_t* w;        // [kvol, k4, cout]
  const int32_t* nbr;      // [n_out, T]
  const float* scale;      // [cout]
  const float* bias;       // [cout] or null
  const int8_t* residual;  // [n_out, cout] or null
  float residual_scale, alpha;
  int activation;
  int64_t n_in, k4, kvol, cout, n_out, T;
  int8_t* y;  // [n_out, cout]
};

// out = clamp(nearbyint(v), -128, 127) after the schema's epilogue, each FP32 operation rounded on its own.
__device__ __forceinline__ int8_t requantize(int32_t acc, int64_t r, int64_t c, const QArgs& a) {
  float v = mul_rn(static_cast<float>(acc), a.scale[c]);
  if (a.bias != nullptr) v = add_rn(v, a.bias[c]);
  if (a.residual != nullptr) v = add_rn(v, mul_rn(static_cast<float>(a.residual[r * a.cout + c]), a.residual_scale));
  if (a.activation == 1) {
    v = v < 0.f ? 0.f : v;
  } else if (a.activation == 2) {
    v = v < 0.f ? mul_rn(v, a.alpha) : v;
  }
  const float q = fminf(fmaxf(round_even(v), -128.f), 127.f);
  return static_cast<int8_t>(static_cast<int>(q));
}

// Row sources of table column j for the tile's rows (-1: absent or past the end); returns whether any is
// present, the same answer in every thread (block-uniform control flow around the barriers).
__device__ __forceinline__ bool load_sources(const QArgs& a, int64_t row0, int64_t j, int32_t* src) {
  __syncthreads();  // the previous column's sources are no longer read
  if (threadIdx.x < kRows) {
    const int64_t r = row0 + threadIdx.x;
    int32_t s = r < a.n_out ? a.nbr[r * a.T + j] : -1;
    src[threadIdx.x] = (s >= 0 && s < a.n_in) ? s : -1;
  }
  __syncthreads();
  bool any = false;
  for (int i = 0; i < kRows; ++i) any = any || src[i] >= 0;
  return any;
}

// The words [kw, kw + kWords) of the tile's gathered rows (As) and of the filter slice wk (Bs), zero outside.
__device__ __forceinline__ void load_step(const QArgs& a, const int32_t* src, const int32_t* wk, int64_t kw,
                                          int64_t col0, int32_t (*As)[kWords + 1], int32_t (*Bs)[kCols]) {
  for (int e = threadIdx.x; e < kRows * kWords; e += kThreads) {
    const int rr = e / kWords, kk = e % kWords;
    const int32_t s = src[rr];
    As[rr][kk] = (s >= 0 && kw + kk < a.k4) ? a.x[static_cast<int64_t>(s) * a.k4 + kw + kk] : 0;
  }
  for (int e = threadIdx.x; e < kWords * kCols; e += kThreads) {
    const int kk = e / kCols, cc = e % kCols;
    Bs[kk][cc] = (kw + kk < a.k4 && col0 + cc < a.cout) ? wk[(kw + kk) * a.cout + col0 + cc] : 0;
  }
}

// ---- bodies: the tile's int32 sums, one K step at a time, then the epilogue of the outputs a thread owns ----

#if !defined(SPCONV_INT8_MFMA) && !defined(SPCONV_INT8_MMA)
constexpr int kTx = 16;  // threads along the channels; each thread owns 2 rows x 4 channels
constexpr int kTy = kThreads / kTx;
constexpr int kRowsPerThread = kRows / kTy;
constexpr int kColsPerThread = kCols / kTx;

// Dot products: thread (tx, ty) owns rows ty + kTy * p and channels tx + kTx * q.
struct SimtBody {
  int32_t acc[kRowsPerThread][kColsPerThread] = {};

  __device__ __forceinline__ void step(const int32_t (*As)[kWords + 1], const int32_t (*Bs)[kCols], int steps) {
    const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
    for (int kk = 0; kk < steps; ++kk) {
      int32_t bv[kColsPerThread];
      for (int q = 0; q < kColsPerThread; ++q) bv[q] = Bs[kk][tx + kTx * q];
      for (int p = 0; p < kRowsPerThread; ++p) {
        const int32_t av = As[ty + kTy * p][kk];
        for (int q = 0; q < kColsPerThread; ++q) acc[p][q] = dot4_i8(av, bv[q], acc[p][q]);
      }
    }
  }

  __device__ __forceinline__ void store(const QArgs& a, int64_t row0, int64_t col0) const {
    const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
    for (int p = 0; p < kRowsPerThread; ++p) {
      const int64_t r = row0 + ty + kTy * p;
      for (int q = 0; q < kColsPerThread; ++q) {
        const int64_t c = col0 + tx + kTx * q;
        if (r < a.n_out && c < a.cout) a.y[r * a.cout + c] = requantize(acc[p][q], r, c, a);
      }
    }
  }
};
using Body = SimtBody;
constexpr int32_t kBodyId = SPCONV_INT8_DOT;
#endif

#if defined(SPCONV_INT8_MFMA)
typedef SPCONV_VECTOR(int, 4) mfma_int4;
constexpr int kWaves = kThreads / 64;
static_assert(kWaves == 4 && kRows == 32 && kCols == 64, "the MFMA body covers the tile with 4 waves of 16 x 32");

// Matrix cores (wave64): wave w owns rows 16 * (w % 2) and channels 32 * (w / 2) + 16 * f, f < 2, as 16 x 16
// int32 tiles. Lane l (lr = l % 16, lq = l / 16): A[lr][k], B[k][lr] for its k, D[4 * lq + i][lr].
// 16x16x16i8: one word (k = 4 lq .. 4 lq + 3) per operand and lane; 16x16x32_i8: two words (k = 8 lq ..).
struct MfmaBody {
  mfma_int4 acc[2] = {mfma_int4{0, 0, 0, 0}, mfma_int4{0, 0, 0, 0}};

  __device__ __forceinline__ void step(const int32_t (*As)[kWords + 1], const int32_t (*Bs)[kCols], int steps) {
    const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, lr = lane % 16, lq = lane / 16;
    const int rb = 16 * (wave % 2), cb = 32 * (wave / 2);
#if SPCONV_INT8_MFMA == 1
    // Words past `steps` are zero in both tiles (load_step), so a partial last group adds nothing.
    for (int ks = 0; ks < steps; ks += 4) {
      const int av = As[rb + lr][ks + lq];
      for (int f = 0; f < 2; ++f)
        acc[f] = __builtin_amdgcn_mfma_i32_16x16x16i8(av, Bs[ks + lq][cb + 16 * f + lr], acc[f], 0, 0, 0);
    }
#else
    for (int ks = 0; ks < steps; ks += 8) {
      const long av = static_cast<long>(static_cast<uint32_t>(As[rb + lr][ks + 2 * lq])) |
                      (static_cast<long>(static_cast<uint32_t>(As[rb + lr][ks + 2 * lq + 1])) << 32);
      for (int f = 0; f < 2; ++f) {
        const int c = cb + 16 * f + lr;
        const long bv = static_cast<long>(static_cast<uint32_t>(Bs[ks + 2 * lq][c])) |
                        (static_cast<long>(static_cast<uint32_t>(Bs[ks + 2 * lq + 1][c])) << 32);
        acc[f] = __builtin_amdgcn_mfma_i32_16x16x32_i8(av, bv, acc[f], 0, 0, 0);
      }
    }
#endif
  }

  __device__ __forceinline__ void store(const QArgs& a, int64_t row0, int64_t col0) const {
    const int lane = threadIdx.x % 64, wave = threadIdx.x / 64, lr = lane % 16, lq = lane / 16;
    for (int f = 0; f < 2; ++f) {
      const int64_t c = col0 + 32 * (wave / 2) + 16 * f + lr;
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + 16 * (wave % 2) + 4 * lq + i;
        if (r < a.n_out && c < a.cout) a.y[r * a.cout + c] = requantize(acc[f][i], r, c, a);
      }
    }
  }
};
using Body = MfmaBody;
constexpr int32_t kBodyId = 3;
#elif defined(SPCONV_INT8_MMA)
constexpr int kWarps = kThreads / 32;
static_assert(kWarps == 8 && kRows == 32 && kCols == 64, "the MMA body covers the tile with 8 warps of 16 x 16");

// NVIDIA integer MMA (32-lane warps): warp w owns rows 16 * (w % 2) and channels 16 * (w / 2) + 8 * f, f < 2, as
// 16 x 8 int32 tiles of mma.m16n8k32; one call takes 8 words (32 input channels) of K. Fragments as in
// mma_s8_16x8x32 (g = lane / 4, t = lane % 4): A word A[row][ks + t] or [ks + 4 + t], B word Bs[ks + t][col].
struct MmaBody {
  int32_t acc[2][4] = {};

  __device__ __forceinline__ void step(const int32_t (*As)[kWords + 1], const int32_t (*Bs)[kCols], int steps) {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    const int rb = 16 * (warp % 2), cb = 16 * (warp / 2);
    // Words past `steps` are zero in both tiles (load_step), so a partial last group adds nothing.
    for (int ks = 0; ks < steps; ks += 8) {
      const uint32_t a[4] = {static_cast<uint32_t>(As[rb + g][ks + t]), static_cast<uint32_t>(As[rb + g + 8][ks + t]),
                             static_cast<uint32_t>(As[rb + g][ks + 4 + t]),
                             static_cast<uint32_t>(As[rb + g + 8][ks + 4 + t])};
      for (int f = 0; f < 2; ++f) {
        const int c = cb + 8 * f + g;
        const uint32_t b[2] = {static_cast<uint32_t>(Bs[ks + t][c]), static_cast<uint32_t>(Bs[ks + 4 + t][c])};
        mma_s8_16x8x32(a, b, acc[f]);
      }
    }
  }

  __device__ __forceinline__ void store(const QArgs& a, int64_t row0, int64_t col0) const {
    const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, g = lane / 4, t = lane % 4;
    for (int f = 0; f < 2; ++f) {
      for (int i = 0; i < 4; ++i) {
        const int64_t r = row0 + 16 * (warp % 2) + g + 8 * (i / 2);
        const int64_t c = col0 + 16 * (warp / 2) + 8 * f + 2 * t + i % 2;
        if (r < a.n_out && c < a.cout) a.y[r * a.cout + c] = requantize(acc[f][i], r, c, a);
      }
    }
  }
};
using Body = MmaBody;
constexpr int32_t kBodyId = 4;
#endif

__global__ void __launch_bounds__(kThreads) quantized_conv_kernel(QArgs a) {
  __shared__ int32_t src[kRows];
  __shared__ int32_t As[kRows][kWords + 1];  // +1: the rows of one wavefront fall in different banks
  __shared__ int32_t Bs[kWords][kCols];
  const int64_t col_tiles = (a.cout + kCols - 1) / kCols, tiles = col_tiles * ((a.n_out + kRows - 1) / kRows);
  for (int64_t tile = blockIdx.x; tile < tiles; tile += gridDim.x) {
    const int64_t row0 = (tile / col_tiles) * kRows, col0 = (tile % col_tiles) * kCols;
    Body body;
    for (int64_t j = 0; j < a.T; ++j) {
      if (!load_sources(a, row0, j, src)) continue;
      const int32_t* wk = a.w + (j % a.kvol) * a.k4 * a.cout;
      for (int64_t kw = 0; kw < a.k4; kw += kWords) {
        load_step(a, src, wk, kw, col0, As, Bs);
        __syncthreads();
        body.step(As, Bs, a.k4 - kw < kWords ? static_cast<int>(a.k4 - kw) : kWords);
        __syncthreads();  // the next step overwrites the tiles
      }
    }
    body.store(a, row0, col0);
  }
}

// Which body this device runs (compiled by the same target rules as the convolution kernel).
__global__ void quantized_body_kernel(int32_t* out) { out[0] = kBodyId; }

}  // namespace

int quantized_conv_forward(const int32_t* x, int64_t n_in, int64_t k4, const int32_t* w, int64_t kvol, int64_t cout,
                           const int32_t* nbr, int64_t n_out, int64_t T, const float* scale, const float* bias,
                           const int8_t* residual, float residual_scale, int activation, float alpha, int8_t* y,
                           void* stream) {
  if (n_out <= 0 || cout <= 0) return 0;
  if (kvol <= 0 || T <= 0 || k4 < 0) return static_cast<int>(hipErrorInvalidValue);
  QArgs a{x, w, nbr, scale, bias, residual, residual_scale, alpha, activation, n_in, k4, kvol, cout, n_out, T, y};
  const int64_t tiles = ((n_out + kRows - 1) / kRows) * ((cout + kCols - 1) / kCols);
  launch_kernel(quantized_conv_kernel, dim3(grid_1d(tiles, 1)), dim3(kThreads), 0, static_cast<hipStream_t>(stream),
                a);
  return last_launch_error();
}

int quantized_conv_body(int32_t* out, void* stream) {
  launch_kernel(quantized_body_kernel, dim3(1), dim3(1), 0, static_cast<hipStream_t>(stream), out);
  return last_launch_error();
}

const char* quantized_body_name(int32_t body) {
  return body == 1 ? "sdot4" : body == 2 ? "dp4a" : body == 3 ? "mfma_i8" : body == 4 ? "mma_s8" : "simt";
}

}  // namespace gpu
}  // namespace spconv
