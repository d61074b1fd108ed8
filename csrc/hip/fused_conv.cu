// Fused gather-GEMM-scatter (the fused route).
//  * forward / dinput: output-stationary implicit GEMM over an out->in neighbour table. A block owns a tile of
//    64 output rows (taken in mask-sorted order) x 64 output channels, loops over the kernel offsets whose bit
//    is set in the OR of the tile's row masks, gathers the input rows of that offset into shared memory and
//    multiplies by the offset's filter slice. Every output element is written by exactly one thread: no atomics.
//    Three bodies share one launch shape (256 threads, 64x64 tile, K step 32) so the host never needs to know
//    the device: SIMT FMA (every target, every dtype), WMMA fp16/bf16 (NVIDIA sm_80+), MFMA fp16/bf16
//    (gfx90a / gfx94x; pipelined, fused_conv_mfma.cuh). The body is picked by the compile target inside the
//    kernel.
//  * dfilter: per-offset gathered GEMM x^T dy with split-K partials in an fp32 workspace, reduced in a fixed
//    order (deterministic, no atomics); same bodies (SIMT, WMMA, MFMA, pipelined sm_80) with the same launch
//    shape.
#include "hip_compat.h"

#if defined(SPCONV_CUDA)
#include <cuda_bf16.h>
#include <mma.h>
#endif

#include <cstdlib>
#include <cstring>
#include <type_traits>

#include "launchers.h"
#include "tc_sm80.h"

namespace spconv {
namespace gpu {
namespace {

constexpr int BM = 64;        // rows of the output tile
constexpr int BN = 64;        // channels of the output tile
constexpr int BK = 32;        // reduction step (input channels)
constexpr int kThreads = 256;

struct FwdArgs {
  const void* x;
  const void* w;
  const int32_t* nbr;    // [n_out, kvol]
  const int32_t* masks;  // [n_out] of this split
  const int32_t* order;  // [n_out] of this split
  int64_t n_out, kvol, cin, cout;
  int k0, k1, gs;        // offsets [k0, k1) of this split, offsets per mask bit
  int accumulate;        // add to y instead of overwriting it
  int mirror;            // read column kvol - 1 - k of nbr for offset k (dinput on a mirrored map's forward
                         // table and its masks / order; one split)
  int vec;               // 16-byte vector loads allowed (16-bit types, cin % 8 == 0, cout % 8 == 0, aligned)
  void* y;
};

// ---- prologue shared by every body: tile rows, tile mask ----
struct TileState {
  int32_t rows[BM];  // output row of each tile slot, -1 past the end
  int32_t src[BM];   // input row feeding each slot through the current offset, -1 if none
  unsigned int mask;
};

// A tile's mask over offsets from its mask over columns (mirror: one split, k0 = 0, k1 = kvol): group g of
// offsets [g gs, (g + 1) gs) is active when any group of their columns kvol - 1 - k is.
__device__ __forceinline__ unsigned int mirrored_mask(const FwdArgs& a, unsigned int m) {
  const int kvol = static_cast<int>(a.kvol);
  unsigned int out = 0u;
  for (int g = 0; g < 32 && g * a.gs < kvol; ++g) {
    const int ka = g * a.gs, kb = ((g + 1) * a.gs < kvol ? (g + 1) * a.gs : kvol) - 1;
    for (int h = (kvol - 1 - kb) / a.gs; h <= (kvol - 1 - ka) / a.gs; ++h)
      if ((m >> h) & 1u) out |= 1u << g;
  }
  return out;
}

__device__ __forceinline__ unsigned int tile_prologue(const FwdArgs& a, TileState& st) {
  const int tid = threadIdx.x;
  if (tid == 0) st.mask = 0u;
  __syncthreads();
  if (tid < BM) {
    const int64_t r = int64_t(blockIdx.x) * BM + tid;
    int32_t row = r < a.n_out ? a.order[r] : -1;
    st.rows[tid] = row;
    if (row >= 0) atomicOr(&st.mask, static_cast<unsigned int>(a.masks[row]));
  }
  __syncthreads();
  if (a.mirror) {  // the masks are by column: offset k is active when its column kvol - 1 - k's group is
    if (tid == 0) st.mask = mirrored_mask(a, st.mask);
    __syncthreads();
  }
  return st.mask;
}

// The column of nbr that offset k reads.
__device__ __forceinline__ int64_t table_column(const FwdArgs& a, int k) {
  return a.mirror ? a.kvol - 1 - k : k;
}

__device__ __forceinline__ void load_sources(const FwdArgs& a, TileState& st, int k) {
  const int tid = threadIdx.x;
  __syncthreads();  // the previous offset's tiles are no longer read
  if (tid < BM) {
    const int32_t row = st.rows[tid];
    st.src[tid] = row >= 0 ? a.nbr[int64_t(row) * a.kvol + table_column(a, k)] : -1;
  }
  __syncthreads();
}

__device__ __forceinline__ bool offset_active(const FwdArgs& a, unsigned int mask, int k) {
  return (mask >> ((k - a.k0) / a.gs)) & 1u;
}

// Walks the active offsets group by group (mask bit g: offsets [k0 + g gs, k0 + (g + 1) gs) of [k0, k1)), so
// that the next offset costs a compare, not a division.
struct OffsetWalk {
  int k, k_end, grp;  // current offset (k1: none left), end of its group, its group
};

__device__ __forceinline__ void walk_group(const FwdArgs& a, unsigned int mask, OffsetWalk& w, int from) {
  const unsigned int rest = from < 32 ? mask >> from : 0u;
  if (rest == 0u) {
    w.k = w.k_end = a.k1;
    return;
  }
  w.grp = from + static_cast<int>(__ffs(rest)) - 1;
  w.k = a.k0 + w.grp * a.gs;
  w.k_end = w.k + a.gs < a.k1 ? w.k + a.gs : a.k1;
  if (w.k >= a.k1) w.k = w.k_end = a.k1;
}

__device__ __forceinline__ void walk_next(const FwdArgs& a, unsigned int mask, OffsetWalk& w) {
  if (++w.k >= w.k_end) walk_group(a, mask, w, w.grp + 1);
}

// Whether any of the tile rows [r0, r0 + n) has a source through the current offset (st.src, stable between
// load_sources' barrier and the next one). A warp whose rows have none skips its multiplies for the offset:
// they would add exact zeros (rows are sorted by mask, so mixed tiles often leave whole row groups idle).
__device__ __forceinline__ bool rows_have_source(const TileState& st, int r0, int n) {
  bool any = false;
  for (int i = 0; i < n; ++i) any |= st.src[r0 + i] >= 0;
  return any;
}

// One output element: y[row, col] = v, or += v when a later split accumulates.
template <typename T>
__device__ __forceinline__ void store_output(const FwdArgs& a, int32_t row, int64_t col, float v) {
  T* dst = static_cast<T*>(a.y) + int64_t(row) * a.cout + col;
  if (a.accumulate) v += to_float(*dst);
  *dst = from_float<T>(v);
}

// Writes a 64x64 fp32 tile held in shared memory (row stride ld) to y, coalesced along channels.
template <typename T>
__device__ __forceinline__ void store_tile(const FwdArgs& a, const TileState& st, const float* c, int ld) {
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  for (int e = threadIdx.x; e < BM * BN; e += kThreads) {
    const int r = e / BN, n = e % BN;
    const int32_t row = st.rows[r];
    const int64_t col = n0 + n;
    if (row >= 0 && col < a.cout) store_output<T>(a, row, col, c[r * ld + n]);
  }
}

// ---- SIMT step shared by forward and dfilter: 4x4 outputs per thread (tx, ty), K = 32 in order ----
template <int LDA, int LDB>
__device__ __forceinline__ void simt_fma_tile(const float (*As)[LDA], const float (*Bs)[LDB], int tx, int ty,
                                              float (&acc)[4][4]) {
#pragma unroll 8
  for (int kk = 0; kk < BK; ++kk) {
    float av[4], bv[4];
    for (int i = 0; i < 4; ++i) av[i] = As[kk][ty * 4 + i];
    for (int j = 0; j < 4; ++j) bv[j] = Bs[kk][tx * 4 + j];
    for (int i = 0; i < 4; ++i)
      for (int j = 0; j < 4; ++j) acc[i][j] = fmaf(av[i], bv[j], acc[i][j]);
  }
}

// ---- SIMT body: fp32 FMA, 4x4 outputs per thread ----
template <typename T>
__device__ void forward_simt(const FwdArgs& a) {
  __shared__ TileState st;
  __shared__ float As[BK][BM + 1];
  __shared__ float Bs[BK][BN + 4];
  const T* x = static_cast<const T*>(a.x);
  const T* w = static_cast<const T*>(a.w);
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  const unsigned int mask = tile_prologue(a, st);
  float acc[4][4] = {};
  for (int k = a.k0; k < a.k1; ++k) {
    if (!offset_active(a, mask, k)) continue;
    load_sources(a, st, k);
    const bool live = rows_have_source(st, ty * 4, 4);  // this thread's rows
    const T* wk = w + int64_t(k) * a.cin * a.cout;
    for (int64_t c0 = 0; c0 < a.cin; c0 += BK) {
      for (int e = tid; e < BK * BM; e += kThreads) {
        const int kk = e % BK, r = e / BK;
        const int32_t s = st.src[r];
        const int64_t c = c0 + kk;
        As[kk][r] = (s >= 0 && c < a.cin) ? to_float(x[int64_t(s) * a.cin + c]) : 0.f;
      }
      for (int e = tid; e < BK * BN; e += kThreads) {
        const int n = e % BN, kk = e / BN;
        const int64_t c = c0 + kk, col = n0 + n;
        Bs[kk][n] = (c < a.cin && col < a.cout) ? to_float(wk[c * a.cout + col]) : 0.f;
      }
      __syncthreads();
      if (live) simt_fma_tile(As, Bs, tx, ty, acc);
      __syncthreads();
    }
  }
  // Epilogue straight from registers.
  for (int i = 0; i < 4; ++i) {
    const int32_t row = st.rows[ty * 4 + i];
    if (row < 0) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t col = n0 + tx * 4 + j;
      if (col < a.cout) store_output<T>(a, row, col, acc[i][j]);
    }
  }
}

#if defined(SPCONV_DEVICE_WMMA) || defined(SPCONV_DEVICE_MFMA)
// Eight 16-bit elements (one 16-byte vector) from src to shared memory, or zeros where src is null.
[[maybe_unused]] __device__ __forceinline__ void copy8_or_zero(uint16_t* dst, const uint16_t* src) {
  uint4 v = make_uint4(0u, 0u, 0u, 0u);
  if (src) v = *reinterpret_cast<const uint4*>(src);
  *reinterpret_cast<uint4*>(dst) = v;
}

// Loads the gathered A tile [BM][BK] and the filter tile [BK][BN] of 16-bit elements (raw bits) into
// shared memory, zero-filling rows without a source and channels past the end.
template <int LDA, int LDB>
__device__ __forceinline__ void load_tiles_16bit(const FwdArgs& a, const TileState& st, int k, int64_t c0,
                                                 uint16_t (*As)[LDA], uint16_t (*Bs)[LDB]) {
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  const uint16_t* wk = static_cast<const uint16_t*>(a.w) + int64_t(k) * a.cin * a.cout;
  const int tid = threadIdx.x;
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  if (a.vec) {
    // One 16-byte vector per thread for each tile: BM*BK/8 == BK*BN/8 == kThreads.
    {
      const int r = tid / (BK / 8), kk = (tid % (BK / 8)) * 8;
      const int32_t s = st.src[r];
      copy8_or_zero(&As[r][kk], s >= 0 && c0 + kk < a.cin ? x + int64_t(s) * a.cin + c0 + kk : nullptr);
    }
    {
      const int kk = tid / (BN / 8), n = (tid % (BN / 8)) * 8;
      copy8_or_zero(&Bs[kk][n], c0 + kk < a.cin && n0 + n < a.cout ? wk + (c0 + kk) * a.cout + n0 + n : nullptr);
    }
  } else {
    for (int e = tid; e < BM * BK; e += kThreads) {
      const int r = e / BK, kk = e % BK;
      const int32_t s = st.src[r];
      const int64_t c = c0 + kk;
      As[r][kk] = (s >= 0 && c < a.cin) ? x[int64_t(s) * a.cin + c] : uint16_t(0);
    }
    for (int e = tid; e < BK * BN; e += kThreads) {
      const int kk = e / BN, n = e % BN;
      const int64_t c = c0 + kk, col = n0 + n;
      Bs[kk][n] = (c < a.cin && col < a.cout) ? wk[c * a.cout + col] : uint16_t(0);
    }
  }
}
#endif

#if defined(SPCONV_DEVICE_WMMA)
// ---- WMMA body (NVIDIA sm_80+): 8 warps, each a 16x32 slice of the tile, fp32 accumulation ----
template <typename T>
using wmma_type = typename std::conditional<std::is_same<T, __half>::value, __half, __nv_bfloat16>::type;
using wmma_acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 16, float>;

// acc[f] += fa * Bs[ks.., n0 + 16 f ..] for the warp's two 16-column fragments (B row-major, stride LDB).
template <typename MT, typename FA, int LDB>
__device__ __forceinline__ void wmma_step(const FA& fa, const uint16_t (*Bs)[LDB], int ks, int n0, wmma_acc (&acc)[2]) {
  using namespace nvcuda;
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    wmma::fragment<wmma::matrix_b, 16, 16, 16, MT, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, reinterpret_cast<const MT*>(&Bs[ks][n0 + f * 16]), LDB);
    wmma::mma_sync(acc[f], fa, fb, acc[f]);
  }
}

// The warp's 16x32 slice (rows m0.., columns n0..) into the shared fp32 tile Cs, then a block barrier (Acc: the
// 16-bit bodies' or the TF32 body's accumulator).
template <int LDC, typename Acc>
__device__ __forceinline__ void wmma_store(Acc (&acc)[2], float (*Cs)[LDC], int m0, int n0) {
  for (int f = 0; f < 2; ++f)
    nvcuda::wmma::store_matrix_sync(&Cs[m0][n0 + f * 16], acc[f], LDC, nvcuda::wmma::mem_row_major);
  __syncthreads();
}

template <typename T>
__device__ void forward_wmma(const FwdArgs& a) {
  using namespace nvcuda;
  using MT = wmma_type<T>;
  constexpr int LDA = BK + 8, LDB = BN + 8, LDC = BN + 4;
  __shared__ TileState st;
  __shared__ __align__(32) uint16_t As[BM][LDA];
  __shared__ __align__(32) uint16_t Bs[BK][LDB];
  __shared__ __align__(32) float Cs[BM][LDC];
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  const unsigned int mask = tile_prologue(a, st);
  wmma_acc acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  for (int k = a.k0; k < a.k1; ++k) {
    if (!offset_active(a, mask, k)) continue;
    load_sources(a, st, k);
    const bool live = rows_have_source(st, wm * 16, 16);  // this warp's rows
    for (int64_t c0 = 0; c0 < a.cin; c0 += BK) {
      load_tiles_16bit<LDA, LDB>(a, st, k, c0, As, Bs);
      __syncthreads();
      if (live) {
#pragma unroll
        for (int ks = 0; ks < BK; ks += 16) {
          wmma::fragment<wmma::matrix_a, 16, 16, 16, MT, wmma::row_major> fa;
          wmma::load_matrix_sync(fa, reinterpret_cast<const MT*>(&As[wm * 16][ks]), LDA);
          wmma_step<MT>(fa, Bs, ks, wn * 32, acc);
        }
      }
      __syncthreads();
    }
  }
  wmma_store(acc, Cs, wm * 16, wn * 32);
  store_tile<T>(a, st, &Cs[0][0], LDC);
}
#endif

#if defined(SPCONV_DEVICE_MFMA)
// ---- MFMA body (gfx90a / gfx94x, wave64): 4 waves, each a 16x64 slice of the tile ----
// v_mfma_f32_16x16x16{f16,bf16_1k} operand layout, lane l: A[l%16][4*(l/16)+i], B[4*(l/16)+i][l%16],
// D[4*(l/16)+i][l%16] for i < 4.
typedef SPCONV_VECTOR(_Float16, 4) mfma_half4;
typedef SPCONV_VECTOR(short, 4) mfma_short4;
typedef SPCONV_VECTOR(float, 4) mfma_float4;

// The wave's 16x64 slice (D layout) into the shared fp32 tile Cs, then a block barrier.
template <int LDC>
__device__ __forceinline__ void mfma_store(const mfma_float4 (&acc)[4], float (*Cs)[LDC], int wave, int lr, int lq) {
  for (int f = 0; f < 4; ++f)
    for (int i = 0; i < 4; ++i) Cs[wave * 16 + 4 * lq + i][f * 16 + lr] = acc[f][i];
  __syncthreads();
}

#include "fused_conv_mfma.cuh"
#endif

// The pipelined sm_80 bodies (forward here, dfilter below): compiled wherever the sm_80 instructions are (nvcc
// passes for sm_80 and later, beside WMMA; the emulated sm80 variant). Which one a launch takes: fused_pipelined.
#if defined(SPCONV_DEVICE_SM80)
#define SPCONV_FORWARD_SM80 1
#include "fused_conv_sm80.cuh"
#endif

// The matrix-core body of this compile target (16-bit types only); the SIMT body everywhere else. An `else`
// branch, not an early return: the other body (and its shared memory) is then never instantiated.
#if defined(SPCONV_DEVICE_WMMA)
#define SPCONV_MMA_BODY(name) name##_wmma
#elif defined(SPCONV_DEVICE_MFMA)
#define SPCONV_MMA_BODY(name) name##_mfma
#endif
#if defined(SPCONV_MMA_BODY)
#define SPCONV_RUN_BODY(name, T, a)                                          \
  if constexpr (!std::is_same<T, float>::value) SPCONV_MMA_BODY(name)<T>(a); \
  else name##_simt<T>(a)
#else
#define SPCONV_RUN_BODY(name, T, a) name##_simt<T>(a)
#endif

#if defined(SPCONV_DEVICE_WMMA)
__device__ void forward_tf32(const FwdArgs& a);  // the TF32 body, beside dfilter's below
#endif

// OptIn: the opted-into body where this pass compiled it: for 16-bit types the pipelined sm_80 body
// (fused_pipelined), for FP32 the TF32 body (the caller allows TF32). Elsewhere the same body as the other
// instantiation; the host launches it only where it exists.
template <typename T, bool OptIn>
__global__ void __launch_bounds__(kThreads) fused_forward_kernel(FwdArgs a) {
#if defined(SPCONV_FORWARD_SM80)
  if constexpr (OptIn && !std::is_same<T, float>::value) forward_sm80<T>(a);
  else
#endif
#if defined(SPCONV_DEVICE_WMMA)
  if constexpr (OptIn && std::is_same<T, float>::value) forward_tf32(a);
  else
#endif
    SPCONV_RUN_BODY(forward, T, a);
}

// ---- dfilter: 64 (cin) x 64 (cout) tile of dW[k] per block, one split-K chunk of the pairs ----
constexpr int BP = 32;  // pairs per step

// Split-K chunks per offset for npairs pairs (slice = kvol * cin * cout): enough blocks to fill the device,
// a bounded fp32 workspace (<= 32M floats). The glue (pairs mode) and the kernels (table mode) both use it.
__host__ __device__ __forceinline__ int64_t fused_dfilter_splits(int64_t npairs, int64_t kvol, int64_t slice) {
  const int64_t per_offset = (npairs + kvol - 1) / kvol;
  int64_t splits = per_offset / 2048;
  splits = splits < 1 ? 1 : splits > 64 ? 64 : splits;
  const int64_t cap = (int64_t{32} << 20) / (slice > 0 ? slice : 1);
  splits = splits < cap ? splits : cap;
  return splits < 1 ? 1 : splits;
}

struct DfArgs {
  const void* x;
  const void* dy;
  const int32_t* pair_in;
  const int32_t* pair_out;
  const int64_t* pair_offsets;
  // Table mode (table != null): the pairs of offset k are the entries >= 0 of column k of table [rows, kvol],
  // in row order (rows_out: rows are outputs and entries inputs; else the reverse), and the split count is
  // the glue's formula on the pair count pair_offsets[kvol] - pair_offsets[0], read on the device (<= splits).
  const int32_t* table;
  int64_t rows, kvol;
  int rows_out;
  int64_t cin, cout;
  int splits, tiles_co;
  int vec;  // 16-byte loads allowed (16-bit types, cin % 8 == 0, cout % 8 == 0, aligned)
  float* ws;
};

// Table mode's staging: a scan of kThreads rows appends its pairs of the block's chunk after the `fill`
// pending ones; each step takes the first BP.
struct DfState {
  int32_t in[BP], out[BP];
  int32_t bin[kThreads + BP], bout[kThreads + BP];
  int32_t scan[kThreads];
  int64_t base, seen;  // next row to scan; pairs of the offset before it
  int fill, more;      // pending pairs; whether rows of the chunk are left
};

// The pair range of this block's (offset, split) and its tile origin; in table mode pb, pe count the pairs of
// the offset (entries >= 0 of its column, in row order).
struct DfTile {
  int64_t pb, pe, ci0, co0;
  int k, s, splits;
};

__device__ __forceinline__ DfTile df_tile(const DfArgs& a) {
  DfTile t;
  t.k = blockIdx.z;
  t.s = blockIdx.y;
  t.ci0 = int64_t(blockIdx.x / a.tiles_co) * BM;
  t.co0 = int64_t(blockIdx.x % a.tiles_co) * BN;
  const int64_t* po = a.pair_offsets;
  int64_t begin = po[t.k], count = po[t.k + 1] - begin;
  t.splits = a.splits;
  if (a.table) {
    const int64_t s = fused_dfilter_splits(po[a.kvol] - po[0], a.kvol, a.kvol * a.cin * a.cout);
    t.splits = static_cast<int>(s < a.splits ? s : a.splits);
    begin = 0;
    if (count < 0) count = 0;
  }
  const int64_t chunk = (count + t.splits - 1) / t.splits;
  t.pb = begin + t.s * chunk;
  t.pe = t.pb + chunk < begin + count ? t.pb + chunk : begin + count;
  if (t.pb > t.pe) t.pb = t.pe;
  return t;
}

__device__ __forceinline__ void df_load_pairs(const DfArgs& a, DfState& st, int64_t p0, int64_t pe) {
  const int tid = threadIdx.x;
  __syncthreads();
  if (tid < BP) {
    const bool ok = p0 + tid < pe;
    st.in[tid] = ok ? a.pair_in[p0 + tid] : -1;
    st.out[tid] = ok ? a.pair_out[p0 + tid] : -1;
  }
  __syncthreads();
}

__device__ __forceinline__ void df_begin(const DfArgs& a, const DfTile& t, DfState& st) {
  if (!a.table) return;
  if (threadIdx.x == 0) {
    st.base = st.seen = 0;
    st.fill = 0;
    st.more = t.pb < t.pe && a.rows > 0;
  }
  __syncthreads();
}

// Table mode: scans rows until BP pairs of the chunk are pending or the chunk ends (block-wide prefix count of
// the column's entries >= 0, so the pairs keep row order).
__device__ void df_fill(const DfArgs& a, const DfTile& t, DfState& st) {
  const int tid = threadIdx.x;
  while (st.fill < BP && st.more) {  // shared values, read after a barrier: the same in every thread
    const int64_t row = st.base + tid;
    const int32_t e = row < a.rows ? a.table[row * a.kvol + t.k] : -1;
    st.scan[tid] = e >= 0 ? 1 : 0;
    __syncthreads();
    for (int off = 1; off < kThreads; off <<= 1) {
      const int v = tid >= off ? st.scan[tid - off] : 0;
      __syncthreads();
      st.scan[tid] += v;
      __syncthreads();
    }
    const int64_t seen = st.seen, lo = seen > t.pb ? seen : t.pb, total = st.scan[kThreads - 1];
    if (e >= 0) {
      const int64_t idx = seen + st.scan[tid] - 1;
      if (idx >= t.pb && idx < t.pe) {
        const int pos = st.fill + static_cast<int>(idx - lo);
        st.bin[pos] = a.rows_out ? e : static_cast<int32_t>(row);
        st.bout[pos] = a.rows_out ? static_cast<int32_t>(row) : e;
      }
    }
    __syncthreads();
    if (tid == 0) {
      const int64_t hi = seen + total < t.pe ? seen + total : t.pe;
      if (hi > lo) st.fill += static_cast<int>(hi - lo);
      st.seen = seen + total;
      st.base += kThreads;
      st.more = st.base < a.rows && st.seen < t.pe;
    }
    __syncthreads();
  }
}

// The next BP pairs of the block's chunk into st.in / st.out (-1 past the end); false when none is left. Called
// by every thread of the block; p0 (the next pair, pairs mode) is the same in all.
__device__ __forceinline__ bool df_next(const DfArgs& a, const DfTile& t, DfState& st, int64_t& p0) {
  if (!a.table) {
    if (p0 >= t.pe) return false;
    df_load_pairs(a, st, p0, t.pe);
    p0 += BP;
    return true;
  }
  const int tid = threadIdx.x;
  __syncthreads();  // the previous step's pairs are no longer read
  df_fill(a, t, st);
  const int fill = st.fill;
  if (fill == 0) return false;
  const int take = fill < BP ? fill : BP, rest = fill - take;
  if (tid < BP) {
    st.in[tid] = tid < take ? st.bin[tid] : -1;
    st.out[tid] = tid < take ? st.bout[tid] : -1;
  }
  int32_t vi = 0, vo = 0;
  if (tid < rest) {
    vi = st.bin[take + tid];
    vo = st.bout[take + tid];
  }
  __syncthreads();
  if (tid < rest) {
    st.bin[tid] = vi;
    st.bout[tid] = vo;
  }
  if (tid == 0) st.fill = rest;
  __syncthreads();
  return true;
}

// Writes a 64x64 fp32 tile (row stride ld) to the workspace slice of (k, s).
[[maybe_unused]] __device__ __forceinline__ void df_store(const DfArgs& a, const DfTile& t, const float* c, int ld) {
  float* out = a.ws + (int64_t(t.k) * t.splits + t.s) * a.cin * a.cout;
  for (int e = threadIdx.x; e < BM * BN; e += kThreads) {
    const int r = e / BN, n = e % BN;
    const int64_t ci = t.ci0 + r, co = t.co0 + n;
    if (ci < a.cin && co < a.cout) out[ci * a.cout + co] = c[r * ld + n];
  }
}

template <typename T>
__device__ void dfilter_simt(const DfArgs& a) {
  __shared__ DfState st;
  __shared__ float As[BP][BM + 4];
  __shared__ float Bs[BP][BN + 4];
  const T* x = static_cast<const T*>(a.x);
  const T* dy = static_cast<const T*>(a.dy);
  const DfTile t = df_tile(a);
  if (t.s >= t.splits) return;  // table mode: past the device's split count
  const int tid = threadIdx.x, tx = tid % 16, ty = tid / 16;
  float acc[4][4] = {};
  df_begin(a, t, st);
  for (int64_t p0 = t.pb; df_next(a, t, st, p0);) {
    for (int e = tid; e < BP * BM; e += kThreads) {
      const int c = e % BM, p = e / BM;
      const int32_t r = st.in[p];
      As[p][c] = (r >= 0 && t.ci0 + c < a.cin) ? to_float(x[int64_t(r) * a.cin + t.ci0 + c]) : 0.f;
    }
    for (int e = tid; e < BP * BN; e += kThreads) {
      const int c = e % BN, p = e / BN;
      const int32_t r = st.out[p];
      Bs[p][c] = (r >= 0 && t.co0 + c < a.cout) ? to_float(dy[int64_t(r) * a.cout + t.co0 + c]) : 0.f;
    }
    __syncthreads();
    simt_fma_tile(As, Bs, tx, ty, acc);
  }
  float* out = a.ws + (int64_t(t.k) * t.splits + t.s) * a.cin * a.cout;
  for (int i = 0; i < 4; ++i) {
    const int64_t ci = t.ci0 + ty * 4 + i;
    if (ci >= a.cin) continue;
    for (int j = 0; j < 4; ++j) {
      const int64_t co = t.co0 + tx * 4 + j;
      if (co < a.cout) out[ci * a.cout + co] = acc[i][j];
    }
  }
}

#if defined(SPCONV_DEVICE_WMMA) || defined(SPCONV_DEVICE_MFMA)
// Gathered tiles of 16-bit raw bits: As[p][ci] = x[pair_in[p], ci0 + ci], Bs[p][co] = dy[pair_out[p], co0 + co].
template <int LD>
__device__ __forceinline__ void df_load_16bit(const DfArgs& a, const DfState& st, const DfTile& t,
                                              uint16_t (*As)[LD], uint16_t (*Bs)[LD]) {
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  const uint16_t* dy = static_cast<const uint16_t*>(a.dy);
  const int tid = threadIdx.x;
  if (a.vec) {  // BP * 64 / 8 == kThreads vectors per tile
    const int p = tid / 8, c = (tid % 8) * 8;
    const int32_t ri = st.in[p], ro = st.out[p];
    copy8_or_zero(&As[p][c], ri >= 0 && t.ci0 + c < a.cin ? x + int64_t(ri) * a.cin + t.ci0 + c : nullptr);
    copy8_or_zero(&Bs[p][c], ro >= 0 && t.co0 + c < a.cout ? dy + int64_t(ro) * a.cout + t.co0 + c : nullptr);
  } else {
    for (int e = tid; e < BP * 64; e += kThreads) {
      const int p = e / 64, c = e % 64;
      const int32_t ri = st.in[p], ro = st.out[p];
      As[p][c] = (ri >= 0 && t.ci0 + c < a.cin) ? x[int64_t(ri) * a.cin + t.ci0 + c] : uint16_t(0);
      Bs[p][c] = (ro >= 0 && t.co0 + c < a.cout) ? dy[int64_t(ro) * a.cout + t.co0 + c] : uint16_t(0);
    }
  }
}
#endif

#if defined(SPCONV_DEVICE_WMMA)
// dW tile = As^T Bs: matrix_a is As read column-major (element (ci, p) at As[p][ci]).
template <typename T>
__device__ void dfilter_wmma(const DfArgs& a) {
  using namespace nvcuda;
  using MT = wmma_type<T>;
  constexpr int LD = 64 + 8, LDC = BN + 4;
  __shared__ DfState st;
  __shared__ __align__(32) uint16_t As[BP][LD];
  __shared__ __align__(32) uint16_t Bs[BP][LD];
  __shared__ __align__(32) float Cs[BM][LDC];
  const DfTile t = df_tile(a);
  if (t.s >= t.splits) return;  // table mode: past the device's split count
  const int warp = threadIdx.x / 32, wm = warp / 2, wn = warp % 2;
  wmma_acc acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  df_begin(a, t, st);
  for (int64_t p0 = t.pb; df_next(a, t, st, p0);) {
    df_load_16bit<LD>(a, st, t, As, Bs);
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < BP; ks += 16) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, MT, wmma::col_major> fa;
      wmma::load_matrix_sync(fa, reinterpret_cast<const MT*>(&As[ks][wm * 16]), LD);
      wmma_step<MT>(fa, Bs, ks, wn * 32, acc);
    }
  }
  wmma_store(acc, Cs, wm * 16, wn * 32);
  df_store(a, t, &Cs[0][0], LDC);
}

// ---- TF32 bodies (NVIDIA sm_80+; FP32 layers where TF32 is allowed): the WMMA bodies' tiling on fp32 tiles,
// m16n16k8 with each operand rounded to TF32 (cvt.rna) as it leaves shared memory, FP32 accumulation. The
// slices of 8 channels (or pairs) run in the SIMT body's order, so the emulated body gives the SIMT body's bits
// on inputs rounded to TF32 beforehand. ----
using tf32_acc = nvcuda::wmma::fragment<nvcuda::wmma::accumulator, 16, 16, 8, float>;

template <typename Frag>
__device__ __forceinline__ void round_to_tf32(Frag& f) {
  for (int i = 0; i < f.num_elements; ++i) f.x[i] = nvcuda::wmma::__float_to_tf32(f.x[i]);
}

// acc[f] += fa * Bs[ks.. ks + 8, n0 + 16 f ..] for the warp's two 16-column fragments (B row-major, stride LDB).
template <typename FA, int LDB>
__device__ __forceinline__ void tf32_step(const FA& fa, const float (*Bs)[LDB], int ks, int n0, tf32_acc (&acc)[2]) {
  using namespace nvcuda;
#pragma unroll
  for (int f = 0; f < 2; ++f) {
    wmma::fragment<wmma::matrix_b, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fb;
    wmma::load_matrix_sync(fb, &Bs[ks][n0 + f * 16], LDB);
    round_to_tf32(fb);
    wmma::mma_sync(acc[f], fa, fb, acc[f]);
  }
}

__device__ void forward_tf32(const FwdArgs& a) {
  using namespace nvcuda;
  constexpr int LDA = BK + 4, LDB = BN + 4, LDC = BN + 4;
  __shared__ TileState st;
  __shared__ __align__(32) float As[BM][LDA];
  __shared__ __align__(32) float Bs[BK][LDB];
  __shared__ __align__(32) float Cs[BM][LDC];
  const float* x = static_cast<const float*>(a.x);
  const float* w = static_cast<const float*>(a.w);
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  const unsigned int mask = tile_prologue(a, st);
  tf32_acc acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  for (int k = a.k0; k < a.k1; ++k) {
    if (!offset_active(a, mask, k)) continue;
    load_sources(a, st, k);
    const bool live = rows_have_source(st, wm * 16, 16);  // this warp's rows
    const float* wk = w + int64_t(k) * a.cin * a.cout;
    for (int64_t c0 = 0; c0 < a.cin; c0 += BK) {
      for (int e = tid; e < BM * BK; e += kThreads) {
        const int r = e / BK, kk = e % BK;
        const int32_t src = st.src[r];
        const int64_t c = c0 + kk;
        As[r][kk] = (src >= 0 && c < a.cin) ? x[int64_t(src) * a.cin + c] : 0.f;
      }
      for (int e = tid; e < BK * BN; e += kThreads) {
        const int kk = e / BN, n = e % BN;
        const int64_t c = c0 + kk, col = n0 + n;
        Bs[kk][n] = (c < a.cin && col < a.cout) ? wk[c * a.cout + col] : 0.f;
      }
      __syncthreads();
      if (live) {
#pragma unroll
        for (int ks = 0; ks < BK; ks += 8) {
          wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::row_major> fa;
          wmma::load_matrix_sync(fa, &As[wm * 16][ks], LDA);
          round_to_tf32(fa);
          tf32_step(fa, Bs, ks, wn * 32, acc);
        }
      }
      __syncthreads();
    }
  }
  wmma_store(acc, Cs, wm * 16, wn * 32);
  store_tile<float>(a, st, &Cs[0][0], LDC);
}

// dW tile = As^T Bs over the pairs, as dfilter_wmma, on fp32 tiles.
__device__ void dfilter_tf32(const DfArgs& a) {
  using namespace nvcuda;
  constexpr int LD = 64 + 4, LDC = BN + 4;
  __shared__ DfState st;
  __shared__ __align__(32) float As[BP][LD];
  __shared__ __align__(32) float Bs[BP][LD];
  __shared__ __align__(32) float Cs[BM][LDC];
  const float* x = static_cast<const float*>(a.x);
  const float* dy = static_cast<const float*>(a.dy);
  const DfTile t = df_tile(a);
  if (t.s >= t.splits) return;  // table mode: past the device's split count
  const int tid = threadIdx.x, warp = tid / 32, wm = warp / 2, wn = warp % 2;
  tf32_acc acc[2];
  wmma::fill_fragment(acc[0], 0.f);
  wmma::fill_fragment(acc[1], 0.f);
  df_begin(a, t, st);
  for (int64_t p0 = t.pb; df_next(a, t, st, p0);) {  // (df_next starts with a barrier: the last step is read)
    for (int e = tid; e < BP * 64; e += kThreads) {
      const int p = e / 64, c = e % 64;
      const int32_t ri = st.in[p], ro = st.out[p];
      As[p][c] = (ri >= 0 && t.ci0 + c < a.cin) ? x[int64_t(ri) * a.cin + t.ci0 + c] : 0.f;
      Bs[p][c] = (ro >= 0 && t.co0 + c < a.cout) ? dy[int64_t(ro) * a.cout + t.co0 + c] : 0.f;
    }
    __syncthreads();
#pragma unroll
    for (int ks = 0; ks < BP; ks += 8) {
      wmma::fragment<wmma::matrix_a, 16, 16, 8, wmma::precision::tf32, wmma::col_major> fa;
      wmma::load_matrix_sync(fa, &As[ks][wm * 16], LD);
      round_to_tf32(fa);
      tf32_step(fa, Bs, ks, wn * 32, acc);
    }
  }
  wmma_store(acc, Cs, wm * 16, wn * 32);
  df_store(a, t, &Cs[0][0], LDC);
}
#endif

#if defined(SPCONV_DEVICE_MFMA)
// This thread's 16-byte pieces of x and dy (channels c.. of the tile) for the pair (ri, ro); zeros for -1 or past
// the tile's channels. Registers only: no array of the thread's is addressed.
__device__ __forceinline__ void df_pair_pieces(const DfArgs& a, const DfTile& t, int32_t ri, int32_t ro, int c,
                                               uint4& va, uint4& vb) {
  va = make_uint4(0u, 0u, 0u, 0u);
  vb = va;
  if (ri >= 0 && t.ci0 + c < a.cin)
    va = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.x) + int64_t(ri) * a.cin + t.ci0 + c);
  if (ro >= 0 && t.co0 + c < a.cout)
    vb = *reinterpret_cast<const uint4*>(static_cast<const uint16_t*>(a.dy) + int64_t(ro) * a.cout + t.co0 + c);
}

// Pair p's pieces (channels c..c+7) stored transposed: b.a[ci][p], b.bt[co][p].
__device__ __forceinline__ void df_stash_pieces_t(MfmaTile<BP>& b, int p, int c, const uint4& va, const uint4& vb) {
  const uint32_t wa[4] = {va.x, va.y, va.z, va.w}, wb[4] = {vb.x, vb.y, vb.z, vb.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    b.a[c + 2 * i][p] = static_cast<uint16_t>(wa[i]);
    b.a[c + 2 * i + 1][p] = static_cast<uint16_t>(wa[i] >> 16);
    b.bt[c + 2 * i][p] = static_cast<uint16_t>(wb[i]);
    b.bt[c + 2 * i + 1][p] = static_cast<uint16_t>(wb[i] >> 16);
  }
}

// A step's gathered x rows and dy rows stored transposed (b.a[ci][p], b.bt[co][p]): dW tile = X^T DY is then
// fused_conv_mfma.cuh's product, K = the step's BP pairs, each operand one 64-bit LDS read.
__device__ __forceinline__ void df_stash_16bit_t(const DfArgs& a, const DfState& st, const DfTile& t,
                                                 MfmaTile<BP>& b) {
  const int tid = threadIdx.x;
  if (a.vec) {  // BP * 64 / 8 == kThreads vectors per tile
    const int p = tid / 8, c = (tid % 8) * 8;
    uint4 va, vb;
    df_pair_pieces(a, t, st.in[p], st.out[p], c, va, vb);
    df_stash_pieces_t(b, p, c, va, vb);
  } else {
    const uint16_t* x = static_cast<const uint16_t*>(a.x);
    const uint16_t* dy = static_cast<const uint16_t*>(a.dy);
    for (int e = tid; e < BP * 64; e += kThreads) {
      const int p = e / 64, c = e % 64;
      const int32_t ri = st.in[p], ro = st.out[p];
      b.a[c][p] = (ri >= 0 && t.ci0 + c < a.cin) ? x[int64_t(ri) * a.cin + t.ci0 + c] : uint16_t(0);
      b.bt[c][p] = (ro >= 0 && t.co0 + c < a.cout) ? dy[int64_t(ro) * a.cout + t.co0 + c] : uint16_t(0);
    }
  }
}

// Pairs mode with 16-byte loads, pipelined: each thread reads its pair's rows (pair p0 + tid / 8, channels
// (tid % 8) * 8: one 16-byte piece of x and of dy) straight from the pair arrays, one step ahead into registers,
// and stores them transposed into the other of two LDS buffers after the step's MFMAs; one barrier per step (a
// buffer is stored again two steps after it was read, past the barrier between). The same pairs, steps and
// K order as the staged loop of dfilter_mfma.
template <typename T>
__device__ __forceinline__ void dfilter_mfma_pairs(const DfArgs& a, const DfTile& t, MfmaShared& sm, int wave,
                                                   int lr, int lq, mfma_float4 (&acc)[4]) {
  const int p = threadIdx.x / 8, c = (threadIdx.x % 8) * 8;
  // This thread's pieces of the step at pair p0 (zeros past the split's end).
  auto fetch = [&](int64_t p0, uint4& va, uint4& vb) {
    const int64_t q = p0 + p;
    df_pair_pieces(a, t, q < t.pe ? a.pair_in[q] : -1, q < t.pe ? a.pair_out[q] : -1, c, va, vb);
  };
  uint4 va = make_uint4(0u, 0u, 0u, 0u), vb = va;
  if (t.pb < t.pe) fetch(t.pb, va, vb);
  int buf = 0;
  for (int64_t p0 = t.pb; p0 < t.pe; p0 += BP, buf ^= 1) {
    df_stash_pieces_t(sm.shallow[buf], p, c, va, vb);
    __syncthreads();  // the step's tile is stored; the other buffer's last reads are done
    if (p0 + BP < t.pe) fetch(p0 + BP, va, vb);  // in flight during the multiplies
    mfma_multiply<T>(sm.shallow[buf], wave, lr, lq, acc);
  }
}

template <typename T>
__device__ void dfilter_mfma(const DfArgs& a) {
  __shared__ DfState st;
  __shared__ MfmaShared sm;  // the step tiles, then the epilogue's tile
  const DfTile t = df_tile(a);
  if (t.s >= t.splits) return;  // table mode: past the device's split count
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64, lr = lane % 16, lq = lane / 16;
  mfma_float4 acc[4];
  for (int f = 0; f < 4; ++f) acc[f] = mfma_float4{0.f, 0.f, 0.f, 0.f};
  if (!a.table && a.vec) {
    dfilter_mfma_pairs<T>(a, t, sm, wave, lr, lq, acc);
  } else {  // table mode (a block-wide scan stages each step's pairs) and element loads
    df_begin(a, t, st);
    for (int64_t p0 = t.pb; df_next(a, t, st, p0);) {  // (df_next starts with a barrier: the last step is read)
      df_stash_16bit_t(a, st, t, sm.shallow[0]);
      __syncthreads();
      mfma_multiply<T>(sm.shallow[0], wave, lr, lq, acc);
    }
  }
  __syncthreads();  // every wave is done with the buffers the epilogue's tile overlaps
  mfma_store(acc, sm.c, wave, lr, lq);
  df_store(a, t, &sm.c[0][0], BN + 4);
}
#endif

#if defined(SPCONV_FORWARD_SM80)
// ---- Pipelined sm_80 dfilter body (NVIDIA sm_80+, fp16 / bf16; tc_sm80.h's instructions, real PTX or the
// emulators of the sm80 HIP-CPU variant), where the sm_80 forward body is ----
//
// Same launch, tile and workspace as the SIMT body: a 64 (cin) x 64 (cout) tile of dW[k] per block, 256
// threads, the pairs of the block's split in order, in steps of BP = 32 pairs (zero rows past the end), the
// split's partial written to its workspace slice. dW tile = X^T DY, K = the pairs: a step's gathered x rows
// (As[p][ci]) and dy rows (Bs[p][co]) are copied global -> shared with cp.async into one of kDfStages stages,
// kDfStages - 1 steps ahead of the step being multiplied; each thread copies one 16-byte piece of each
// (pair row tid / 8, channels (tid % 8) * 8) at every step. Pairs mode: the thread reads its pair's rows one
// step ahead; table mode: df_next's block-wide scan stages the step's pairs (called by every thread).
// 8 warps as 2 (cin) x 4 (cout), a 32 x 16 warp tile: per 16-deep slice two ldmatrix.x4.trans of A (A = As^T)
// and one of B, four mma.sync m16n8k16 into fp32 accumulators, stored straight from registers. Each output
// element adds its pairs one at a time in pair order (the SIMT body's fmaf sequence; the zero rows past the
// end add nothing), so the emulated body gives the SIMT body's bits.
// One barrier per step: after it, step i's data is visible (each thread waited for its own copies before) and
// stage (i - 1) % S is no longer read, so the copies of step i + S - 1 go there.

constexpr int kDfStages = 4;

struct DfSm80Stage {
  static constexpr int kLd = 64 + 8;  // padded row stride (elements): ldmatrix rows in distinct bank groups
  uint16_t a[BP][kLd];                // x rows of the step's pairs, channels ci0..
  uint16_t b[BP][kLd];                // dy rows, channels co0..
};
static_assert(BP * 64 / 8 == kThreads, "one 16-byte piece of each tile per thread and step");

// This thread's copies: pair row pr of a step, channels pc.. of both tiles. Pairs mode reads its pair's rows one
// step ahead (ri, ro; -1: none) through pin, pout, with `left` pairs of the split from there.
struct DfSm80Feed {
  const int32_t* pin;
  const int32_t* pout;
  int left;
  int32_t ri, ro;
  int pr, pc;
  int a_lim, b_lim;     // channels of this thread's pieces inside the tile's columns: cin - ci0 - pc, ...
  const char* xa;       // &x[0][ci0 + pc]
  const char* dyb;      // &dy[0][co0 + pc]
  uint32_t lda, ldb;    // row strides in bytes (launch_dfilter refuses channels past 2^30)
  uint32_t dst;         // this thread's A piece in stage 0 (its B piece: + offsetof(DfSm80Stage, b))
};

__device__ __forceinline__ void df_sm80_feed_init(const DfArgs& a, const DfTile& t, DfSm80Feed& f) {
  const int tid = threadIdx.x;
  f.pr = tid / 8;
  f.pc = (tid % 8) * 8;
  f.a_lim = static_cast<int>(a.cin - t.ci0) - f.pc;
  f.b_lim = static_cast<int>(a.cout - t.co0) - f.pc;
  f.lda = static_cast<uint32_t>(a.cin) * 2u;
  f.ldb = static_cast<uint32_t>(a.cout) * 2u;
  f.xa = static_cast<const char*>(a.x) + (t.ci0 + f.pc) * 2;
  f.dyb = static_cast<const char*>(a.dy) + (t.co0 + f.pc) * 2;
  f.dst = static_cast<uint32_t>(offsetof(DfSm80Stage, a)) + (f.pr * DfSm80Stage::kLd + f.pc) * 2u;
}

// Pairs mode: this thread's pair of the next step (rows -1 past the end of the split).
__device__ __forceinline__ void df_sm80_read_pair(DfSm80Feed& f) {
  const bool ok = f.left > 0;
  f.ri = ok ? *f.pin : -1;
  f.ro = ok ? *f.pout : -1;
  f.pin += BP;
  f.pout += BP;
  f.left -= BP;
}

// This thread's pieces of one step into `stage`: x row ri and dy row ro (-1: a zero row).
template <bool Vec>
__device__ __forceinline__ void df_sm80_copy(const DfSm80Feed& f, int32_t ri, int32_t ro, unsigned char* stage) {
  uint16_t* da = reinterpret_cast<uint16_t*>(stage + f.dst);
  uint16_t* db = reinterpret_cast<uint16_t*>(stage + f.dst + offsetof(DfSm80Stage, b));
  const bool ia = ri >= 0 && f.a_lim > 0, ib = ro >= 0 && f.b_lim > 0;
  // Unsigned 32 x 32 -> 64-bit row offsets (one wide multiply-add each on the GPU).
  const uint16_t* sa = reinterpret_cast<const uint16_t*>(f.xa + uint64_t(uint32_t(ia ? ri : 0)) * f.lda);
  const uint16_t* sb = reinterpret_cast<const uint16_t*>(f.dyb + uint64_t(uint32_t(ib ? ro : 0)) * f.ldb);
  if constexpr (Vec) {  // cin, cout multiples of 8: a piece is wholly inside or wholly out
    tc::cp_async<16>(da, sa, ia ? 16 : 0);
    tc::cp_async<16>(db, sb, ib ? 16 : 0);
  } else {
    for (int e = 0; e < 8; ++e) {
      da[e] = (ia && e < f.a_lim) ? sa[e] : uint16_t(0);
      db[e] = (ib && e < f.b_lim) ? sb[e] : uint16_t(0);
    }
  }
}

// acc[mi][nj] += A fragment mi (rows 16 mi..) times the n8 tile nj of B (registers bf[2 nj], bf[2 nj + 1]): the
// four mma.sync of the dfilter body's 32x16 warp tile in one 16-deep slice.
template <typename T>
__device__ __forceinline__ void warp_tile_mma(const uint32_t (&af)[2][4], const uint32_t (&bf)[4],
                                              float (&acc)[2][2][4]) {
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int nj = 0; nj < 2; ++nj) {
      const uint32_t b2[2] = {bf[2 * nj], bf[2 * nj + 1]};
      tc::mma_m16n8k16<T>(acc[mi][nj], af[mi], b2);
    }
}

// One step's multiplies out of `stage`: per 16-deep slice of pairs, acc[mi][nj] += the warp's 32 x 16 slice of
// As^T (rows = ci) times Bs. fa, fb: this lane's ldmatrix rows in stage 0 (see df_sm80_fragment_rows).
template <typename T>
__device__ __forceinline__ void df_sm80_multiply(const unsigned char* stage, uint32_t fa, uint32_t fb,
                                                 float (&acc)[2][2][4]) {
  constexpr int LD = DfSm80Stage::kLd;
  const uint16_t* As = reinterpret_cast<const uint16_t*>(stage + fa);
  const uint16_t* Bs = reinterpret_cast<const uint16_t*>(stage + fb);
#pragma unroll
  for (int ks = 0; ks < BP; ks += 16) {
    uint32_t af[2][4], bf[4];
#pragma unroll
    for (int mi = 0; mi < 2; ++mi) tc::ldmatrix<4, true>(af[mi], As + ks * LD + 16 * mi);
    tc::ldmatrix<4, true>(bf, Bs + ks * LD);
    warp_tile_mma<T>(af, bf, acc);
  }
}

// This lane's ldmatrix rows (byte offsets in stage 0); lane 8 i + j addresses row j of matrix i. Both tiles are
// stored [p][c] and loaded transposed. A (rows ci): matrix i holds p 0-7 / 8-15 (i / 2) x ci 0-7 / 8-15 (i % 2),
// A's registers a0..a3. B: p 0-7 / 8-15 (i % 2) x co 0-7 / 8-15 (i / 2), each n8 tile's two registers
// (bf[2 nj], bf[2 nj + 1]).
__device__ __forceinline__ void df_sm80_fragment_rows(int wr, int wc, int lane, uint32_t& fa, uint32_t& fb) {
  constexpr int LD = DfSm80Stage::kLd;
  const int i = lane / 8, j = lane % 8;
  fa = static_cast<uint32_t>(offsetof(DfSm80Stage, a)) + ((j + 8 * (i / 2)) * LD + wr + 8 * (i % 2)) * 2u;
  fb = static_cast<uint32_t>(offsetof(DfSm80Stage, b)) + ((j + 8 * (i % 2)) * LD + wc + 8 * (i / 2)) * 2u;
}

// Step i's copies have landed for every thread, and stage (i - 1) % S is no longer read.
__device__ __forceinline__ void df_sm80_step_wait() {
  tc::cp_async_wait_group<kDfStages - 2>();  // this thread's copies of step i have landed
  __syncthreads();                           // everyone's have; stage (i - 1) % S is free
}

// The split's partial from the accumulators into its workspace slice. Accumulator element q of tile (mi, nj):
// row g + 8 (q / 2), column 2 t + q % 2 of the 16 x 8 tile.
__device__ __forceinline__ void df_sm80_store(const DfArgs& a, const DfTile& t, int wr, int wc, int lane,
                                              const float (&acc)[2][2][4]) {
  float* out = a.ws + (int64_t(t.k) * t.splits + t.s) * a.cin * a.cout;
  const int g = lane / 4, tq = lane % 4;
#pragma unroll
  for (int mi = 0; mi < 2; ++mi)
#pragma unroll
    for (int q2 = 0; q2 < 2; ++q2) {
      const int64_t ci = t.ci0 + wr + 16 * mi + g + 8 * q2;
#pragma unroll
      for (int nj = 0; nj < 2; ++nj)
#pragma unroll
        for (int q1 = 0; q1 < 2; ++q1) {
          const int64_t co = t.co0 + wc + 8 * nj + 2 * tq + q1;
          if (ci < a.cin && co < a.cout) out[ci * a.cout + co] = acc[mi][nj][2 * q2 + q1];
        }
    }
}

// Pairs mode: the split's step count is known, so the loop holds only the copies and the multiplies.
template <typename T, bool Vec>
__device__ __forceinline__ void dfilter_sm80_pairs(const DfArgs& a, const DfTile& t, unsigned char* sm, int wr,
                                                   int wc, int lane) {
  constexpr int S = kDfStages;
  constexpr uint32_t kStage = sizeof(DfSm80Stage);
  DfSm80Feed f;
  df_sm80_feed_init(a, t, f);
  f.pin = a.pair_in + t.pb + f.pr;
  f.pout = a.pair_out + t.pb + f.pr;
  f.left = static_cast<int>(t.pe - t.pb) - f.pr;  // a split's pairs: some of one offset's, below 2^31
  df_sm80_read_pair(f);
  uint32_t fa, fb;
  df_sm80_fragment_rows(wr, wc, lane, fa, fb);
  const int steps = static_cast<int>((t.pe - t.pb + BP - 1) / BP);
  for (int s = 0; s < S - 1; ++s) {
    if (s < steps) {
      df_sm80_copy<Vec>(f, f.ri, f.ro, sm + s * kStage);
      df_sm80_read_pair(f);
    }
    tc::cp_async_commit();  // empty groups keep the count of groups per step uniform
  }
  float acc[2][2][4] = {};
  unsigned int i = 0;  // unsigned: i % S is a mask
  for (; int(i) + S - 1 < steps; ++i) {
    df_sm80_step_wait();
    df_sm80_copy<Vec>(f, f.ri, f.ro, sm + (i + S - 1) % S * kStage);
    df_sm80_read_pair(f);
    tc::cp_async_commit();
    df_sm80_multiply<T>(sm + i % S * kStage, fa, fb, acc);
  }
  for (; int(i) < steps; ++i) {  // the last S - 1 steps: nothing left to copy
    df_sm80_step_wait();
    tc::cp_async_commit();
    df_sm80_multiply<T>(sm + i % S * kStage, fa, fb, acc);
  }
  tc::cp_async_wait_all();
  df_sm80_store(a, t, wr, wc, lane, acc);
}

// Table mode: df_next stages each step's pairs (a block-wide scan, called by every thread); the step count is
// known only at the end.
template <typename T, bool Vec>
__device__ __forceinline__ void dfilter_sm80_table(const DfArgs& a, const DfTile& t, DfState& st, unsigned char* sm,
                                                   int wr, int wc, int lane) {
  constexpr int S = kDfStages;
  constexpr uint32_t kStage = sizeof(DfSm80Stage);
  DfSm80Feed f;
  df_sm80_feed_init(a, t, f);
  df_begin(a, t, st);
  uint32_t fa, fb;
  df_sm80_fragment_rows(wr, wc, lane, fa, fb);
  int64_t unused = 0;
  // issued: steps copied so far; more: whether the split may have another (the same in every thread).
  int issued = 0;
  bool more = true;
  for (int s = 0; s < S - 1; ++s) {
    if (more && (more = df_next(a, t, st, unused))) {
      df_sm80_copy<Vec>(f, st.in[f.pr], st.out[f.pr], sm + issued * kStage);
      ++issued;
    }
    tc::cp_async_commit();
  }
  float acc[2][2][4] = {};
  for (int i = 0; i < issued; ++i) {
    df_sm80_step_wait();
    if (more && (more = df_next(a, t, st, unused))) {
      df_sm80_copy<Vec>(f, st.in[f.pr], st.out[f.pr], sm + (i + S - 1) % S * kStage);
      ++issued;
    }
    tc::cp_async_commit();
    df_sm80_multiply<T>(sm + i % S * kStage, fa, fb, acc);
  }
  tc::cp_async_wait_all();
  df_sm80_store(a, t, wr, wc, lane, acc);
}

template <typename T>
__device__ void dfilter_sm80(const DfArgs& a) {
  __shared__ DfState st;
  __shared__ __attribute__((aligned(16))) unsigned char sm[kDfStages * sizeof(DfSm80Stage)];
  const DfTile t = df_tile(a);
  if (t.s >= t.splits) return;  // table mode: past the device's split count
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = (warp / 4) * 32, wc = (warp % 4) * 16;
  if (a.table) {
    if (a.vec)
      dfilter_sm80_table<T, true>(a, t, st, sm, wr, wc, lane);
    else
      dfilter_sm80_table<T, false>(a, t, st, sm, wr, wc, lane);
  } else {
    if (a.vec)
      dfilter_sm80_pairs<T, true>(a, t, sm, wr, wc, lane);
    else
      dfilter_sm80_pairs<T, false>(a, t, sm, wr, wc, lane);
  }
}
#endif  // SPCONV_FORWARD_SM80

template <typename T, bool OptIn>
__global__ void __launch_bounds__(kThreads) dfilter_kernel(DfArgs a) {
#if defined(SPCONV_FORWARD_SM80)
  if constexpr (OptIn && !std::is_same<T, float>::value) dfilter_sm80<T>(a);
  else
#endif
#if defined(SPCONV_DEVICE_WMMA)
  if constexpr (OptIn && std::is_same<T, float>::value) dfilter_tf32(a);
  else
#endif
    SPCONV_RUN_BODY(dfilter, T, a);
}

template <typename T>
__global__ void dfilter_reduce_kernel(const float* __restrict__ ws, int64_t kvol, int64_t cc, int splits,
                                      T* __restrict__ dw) {
  const int64_t total = kvol * cc;
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e / cc, rest = e - k * cc;
    const float* p = ws + k * splits * cc + rest;
    float sum = 0.f;
    for (int s = 0; s < splits; ++s) sum += p[int64_t(s) * cc];
    dw[e] = from_float<T>(sum);
  }
}

// Table mode: the split count from the pair count on the device; optionally also the transposed filters
// wt[k][co][ci] = w[k][ci][co] (the dinput filters), so that the backward needs no separate transpose.
template <typename T>
__global__ void dfilter_reduce_table_kernel(const float* __restrict__ ws, const int64_t* __restrict__ pair_offsets,
                                            int64_t kvol, int64_t cin, int64_t cout, int splits_max,
                                            T* __restrict__ dw, const T* __restrict__ w, T* __restrict__ wt) {
  const int64_t cc = cin * cout, total = kvol * cc;
  int64_t splits = 1;
  if (dw) {
    splits = fused_dfilter_splits(pair_offsets[kvol] - pair_offsets[0], kvol, total);
    splits = splits < splits_max ? splits : splits_max;
  }
  for (int64_t e = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; e < total; e += int64_t(gridDim.x) * blockDim.x) {
    const int64_t k = e / cc, rest = e - k * cc;
    if (dw) {
      const float* p = ws + k * splits * cc + rest;
      float sum = 0.f;
      for (int64_t s = 0; s < splits; ++s) sum += p[s * cc];
      dw[e] = from_float<T>(sum);
    }
    if (wt) {
      const int64_t ci = rest / cout, co = rest - ci * cout;
      wt[k * cc + co * cin + ci] = w[e];
    }
  }
}

// A second pair for one (output, offset) would overwrite the first: claim the entry instead and flag the
// repeat (whether a repeat exists does not depend on the order of the claims).
__global__ void map_fill_kernel(const int32_t* pair_in, const int32_t* pair_out, const int64_t* pair_offsets,
                                int64_t kvol, int64_t npairs, int32_t* nbr, int32_t* repeated) {
  for (int64_t p = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; p < npairs; p += int64_t(gridDim.x) * blockDim.x) {
    // k = the last offset with pair_offsets[k] <= p
    int64_t lo = 0, hi = kvol;  // invariant: pair_offsets[lo] <= p < pair_offsets[hi]
    while (hi - lo > 1) {
      const int64_t mid = (lo + hi) / 2;
      if (pair_offsets[mid] <= p)
        lo = mid;
      else
        hi = mid;
    }
    if (atomicCAS(nbr + int64_t(pair_out[p]) * kvol + lo, -1, pair_in[p]) != -1 && repeated) atomicExch(repeated, 1);
  }
}

__global__ void map_masks_kernel(const int32_t* nbr, int64_t num_rows, int64_t kvol, int num_splits,
                                 int32_t* masks, unsigned long long* keys) {
  for (int64_t r = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; r < num_rows;
       r += int64_t(gridDim.x) * blockDim.x) {
    const int32_t* row = nbr + r * kvol;
    for (int s = 0; s < num_splits; ++s) {
      const int64_t k0 = s * kvol / num_splits, k1 = (s + 1) * kvol / num_splits;
      const int64_t gs = (k1 - k0 + 31) / 32 > 0 ? (k1 - k0 + 31) / 32 : 1;
      unsigned int m = 0u;
      for (int64_t k = k0; k < k1; ++k)
        if (row[k] >= 0) m |= 1u << ((k - k0) / gs);
      masks[s * num_rows + r] = static_cast<int32_t>(m);
      if (keys) keys[s * num_rows + r] = m;
    }
  }
}

template <typename T>
struct TypeTag {
  using type = T;
};

// f(TypeTag<element type of t>{}): the one dtype switch of the fused launchers.
template <typename F>
int with_element_type(DType t, F&& f) {
  switch (t) {
    case DType::F32: return f(TypeTag<float>{});
    case DType::F16: return f(TypeTag<__half>{});
    case DType::BF16: return f(TypeTag<bf16_t>{});
    default: return static_cast<int>(hipErrorInvalidValue);
  }
}

// The 16-byte tile loads of the 16-bit bodies: eight channels per vector, both operands 16-byte aligned.
inline int vector_loads_ok(bool k16, int64_t cin, int64_t cout, const void* p, const void* q) {
  return k16 && cin % 8 == 0 && cout % 8 == 0 && reinterpret_cast<uintptr_t>(p) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(q) % 16 == 0;
}

// Builds whose fused kernels hold the pipelined sm_80 bodies: CUDA (in the code for sm_80 and later) and the
// emulated sm80 variant; the TF32 bodies: CUDA (the same code) and the emulated WMMA variant. Elsewhere only the
// other instantiation exists and is ever instantiated.
#if defined(SPCONV_CUDA) || defined(SPCONV_EMULATE_SM80)
constexpr bool kHasPipelined = true;
#else
constexpr bool kHasPipelined = false;
#endif
#if defined(SPCONV_CUDA) || defined(SPCONV_EMULATE_WMMA)
constexpr bool kHasTf32 = true;
#else
constexpr bool kHasTf32 = false;
#endif

// Whether the current device runs code for sm_80 or later (CUDA builds; older devices have no such code, and
// their kernels would run the other body anyway).
[[maybe_unused]] bool device_sm80() {
#if defined(SPCONV_CUDA)
  int dev = 0, major = 0;
  if (hipGetDevice(&dev) != hipSuccess ||
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) != hipSuccess)
    return false;
  return major >= 8;
#else
  return false;
#endif
}

// Whether this launch takes the pipelined sm_80 bodies for 16-bit types. SPCONV_FUSED_SM80=1 asks for them and
// =0 refuses them, read at every launch (a switch for checks and measurements, no rebuild); unset, the build's
// default: on in the emulated sm80 variant (its only tensor-core body), off on NVIDIA GPUs, where WMMA stays the
// default until the pipelined bodies have run on one.
bool fused_pipelined() {
  if constexpr (!kHasPipelined) return false;
  const char* env = std::getenv("SPCONV_FUSED_SM80");
#if defined(SPCONV_EMULATE_SM80)
  return !(env && env[0] == '0');
#else
  return env && env[0] == '1' && device_sm80();
#endif
}

// Whether an FP32 launch whose caller allows TF32 takes the TF32 body.
[[maybe_unused]] bool fused_tf32(bool allowed) {
#if defined(SPCONV_EMULATE_WMMA)
  return allowed;
#else
  return allowed && device_sm80();
#endif
}

// Whether this build holds the opted-into instantiation for T (FP32: the TF32 bodies; 16-bit: the pipelined
// sm_80 ones), and whether a launch takes it.
template <typename T>
constexpr bool kHasOptIn = std::is_same<T, float>::value ? kHasTf32 : kHasPipelined;
template <typename T>
bool takes_opt_in(bool tf32) {
  return std::is_same<T, float>::value ? fused_tf32(tf32) : fused_pipelined();
}

// The instantiation a launch takes.
template <typename T>
auto forward_kernel(bool tf32) {
  if constexpr (kHasOptIn<T>)
    if (takes_opt_in<T>(tf32)) return &fused_forward_kernel<T, true>;
  return &fused_forward_kernel<T, false>;
}
template <typename T>
auto dfilter_kernel_for(bool tf32) {
  if constexpr (kHasOptIn<T>)
    if (takes_opt_in<T>(tf32)) return &dfilter_kernel<T, true>;
  return &dfilter_kernel<T, false>;
}

template <typename T>
int launch_forward(FwdArgs a, int num_splits, hipStream_t stream, bool tf32) {
  const int64_t row_tiles = (a.n_out + BM - 1) / BM, col_tiles = (a.cout + BN - 1) / BN;
  if (row_tiles > 0x7fffffffLL || col_tiles > 65535) return static_cast<int>(hipErrorInvalidValue);
  if (a.cin > 0x7fffffffLL - BK) return static_cast<int>(hipErrorInvalidValue);  // the sm80 body counts in int
  const int32_t* masks = a.masks;
  const int32_t* order = a.order;
  const auto kernel = forward_kernel<T>(tf32);
  for (int s = 0; s < num_splits; ++s) {
    a.k0 = static_cast<int>(s * a.kvol / num_splits);
    a.k1 = static_cast<int>((s + 1) * a.kvol / num_splits);
    a.gs = static_cast<int>((a.k1 - a.k0 + 31) / 32);
    if (a.gs < 1) a.gs = 1;
    a.masks = masks + s * a.n_out;
    a.order = order + s * a.n_out;
    a.accumulate = s > 0;
    dim3 grid(static_cast<unsigned int>(row_tiles), static_cast<unsigned int>(col_tiles));
    launch_kernel(kernel, grid, kThreads, 0, stream, a);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
  }
  return 0;
}

template <typename T>
int launch_dfilter(const void* x, const void* dy, const int32_t* pair_in, const int32_t* pair_out,
                   const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout, int splits, float* ws,
                   void* dw, hipStream_t stream, bool tf32) {
  const int64_t tiles_ci = (cin + BM - 1) / BM, tiles_co = (cout + BN - 1) / BN;
  if (kvol > 65535 || splits > 65535 || tiles_ci * tiles_co > 0x7fffffffLL) return static_cast<int>(hipErrorInvalidValue);
  if (cin > 0x3fffffffLL || cout > 0x3fffffffLL) return static_cast<int>(hipErrorInvalidValue);  // sm80: int strides
  DfArgs a{};
  a.x = x;
  a.dy = dy;
  a.pair_in = pair_in;
  a.pair_out = pair_out;
  a.pair_offsets = pair_offsets;
  a.cin = cin;
  a.cout = cout;
  a.splits = splits;
  a.tiles_co = static_cast<int>(tiles_co);
  a.vec = vector_loads_ok(!std::is_same<T, float>::value, cin, cout, x, dy);
  a.ws = ws;
  dim3 grid(static_cast<unsigned int>(tiles_ci * tiles_co), static_cast<unsigned int>(splits),
            static_cast<unsigned int>(kvol));
  launch_kernel(dfilter_kernel_for<T>(tf32), grid, kThreads, 0, stream, a);
  SPCONV_RETURN_IF_ERROR(last_launch_error());
  const int64_t total = kvol * cin * cout;
  launch_kernel(dfilter_reduce_kernel<T>, grid_1d(total, kThreads), kThreads, 0, stream, ws, kvol, cin * cout,
      splits, static_cast<T*>(dw));
  return last_launch_error();
}

template <typename T>
int launch_dfilter_table(const void* x, const void* dy, const int32_t* table, int64_t rows, bool rows_out,
                         const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout, int splits_max,
                         float* ws, void* dw, const void* w, void* wt, hipStream_t stream, bool tf32) {
  const int64_t tiles_ci = (cin + BM - 1) / BM, tiles_co = (cout + BN - 1) / BN;
  if (kvol > 65535 || splits_max < 1 || splits_max > 65535 || tiles_ci * tiles_co > 0x7fffffffLL)
    return static_cast<int>(hipErrorInvalidValue);
  if (cin > 0x3fffffffLL || cout > 0x3fffffffLL) return static_cast<int>(hipErrorInvalidValue);  // sm80: int strides
  if (dw) {
    DfArgs a{};
    a.x = x;
    a.dy = dy;
    a.pair_offsets = pair_offsets;
    a.table = table;
    a.rows = rows;
    a.kvol = kvol;
    a.rows_out = rows_out ? 1 : 0;
    a.cin = cin;
    a.cout = cout;
    a.splits = splits_max;
    a.tiles_co = static_cast<int>(tiles_co);
    a.vec = vector_loads_ok(!std::is_same<T, float>::value, cin, cout, x, dy);
    a.ws = ws;
    dim3 grid(static_cast<unsigned int>(tiles_ci * tiles_co), static_cast<unsigned int>(splits_max),
              static_cast<unsigned int>(kvol));
    launch_kernel(dfilter_kernel_for<T>(tf32), grid, kThreads, 0, stream, a);
    SPCONV_RETURN_IF_ERROR(last_launch_error());
  }
  if (!dw && !wt) return 0;
  launch_kernel(dfilter_reduce_table_kernel<T>, grid_1d(kvol * cin * cout, kThreads), kThreads, 0, stream, ws,
      pair_offsets, kvol, cin, cout, splits_max, static_cast<T*>(dw), static_cast<const T*>(w), static_cast<T*>(wt));
  return last_launch_error();
}

}  // namespace

int64_t fused_dfilter_split_count(int64_t npairs, int64_t kvol, int64_t slice) {
  return fused_dfilter_splits(npairs, kvol, slice);
}

int fused_conv_dfilter_table(DType t, const void* x, const void* dy, const int32_t* table, int64_t rows,
                             bool rows_out, const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout,
                             int splits_max, float* workspace, void* dw, const void* w, void* wt, void* stream,
                             bool tf32) {
  if (kvol <= 0 || cin <= 0 || cout <= 0) return 0;
  hipStream_t s = static_cast<hipStream_t>(stream);
  return with_element_type(t, [&](auto tag) {
    return launch_dfilter_table<typename decltype(tag)::type>(x, dy, table, rows, rows_out, pair_offsets, kvol, cin,
                                                              cout, splits_max, workspace, dw, w, wt, s, tf32);
  });
}

int fused_map_fill(const int32_t* pair_in, const int32_t* pair_out, const int64_t* pair_offsets, int64_t kvol,
                   int64_t npairs, int64_t num_rows, int32_t* nbr, int32_t* repeated, void* stream) {
  (void)num_rows;
  if (npairs <= 0 || kvol <= 0) return 0;
  launch_kernel(map_fill_kernel, grid_1d(npairs, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), pair_in,
      pair_out, pair_offsets, kvol, npairs, nbr, repeated);
  return last_launch_error();
}

int fused_map_masks(const int32_t* nbr, int64_t num_rows, int64_t kvol, int num_splits, int32_t* masks,
                    unsigned long long* sort_keys, void* stream) {
  if (num_rows <= 0 || num_splits <= 0) return 0;
  launch_kernel(map_masks_kernel, grid_1d(num_rows, kThreads), kThreads, 0, static_cast<hipStream_t>(stream), nbr,
      num_rows, kvol, num_splits, masks, sort_keys);
  return last_launch_error();
}

int fused_conv_forward(DType t, const void* x, const void* w, const int32_t* nbr, const int32_t* masks,
                       const int32_t* order, int64_t n_out, int64_t kvol, int64_t cin, int64_t cout,
                       int num_splits, void* y, void* stream, bool mirror, bool tf32) {
  if (n_out <= 0 || cout <= 0) return 0;
  if (num_splits < 1 || kvol < 1 || (mirror && num_splits != 1)) return static_cast<int>(hipErrorInvalidValue);
  FwdArgs a{};
  a.x = x;
  a.w = w;
  a.nbr = nbr;
  a.masks = masks;
  a.order = order;
  a.n_out = n_out;
  a.kvol = kvol;
  a.cin = cin;
  a.cout = cout;
  a.y = y;
  a.mirror = mirror ? 1 : 0;
  a.vec = vector_loads_ok(t != DType::F32, cin, cout, x, w);
  hipStream_t s = static_cast<hipStream_t>(stream);
  return with_element_type(t, [&](auto tag) {
    return launch_forward<typename decltype(tag)::type>(a, num_splits, s, tf32);
  });
}

int fused_conv_dfilter(DType t, const void* x, const void* dy, const int32_t* pair_in, const int32_t* pair_out,
                       const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout, int splits,
                       float* workspace, void* dw, void* stream, bool tf32) {
  if (kvol <= 0 || cin <= 0 || cout <= 0) return 0;
  if (splits < 1) return static_cast<int>(hipErrorInvalidValue);
  hipStream_t s = static_cast<hipStream_t>(stream);
  return with_element_type(t, [&](auto tag) {
    return launch_dfilter<typename decltype(tag)::type>(x, dy, pair_in, pair_out, pair_offsets, kvol, cin, cout,
                                                        splits, workspace, dw, s, tf32);
  });
}

namespace {
// Which bodies this device runs: the kernel is compiled by the same target rules as the forward kernel, so the
// code the runtime picks for the device (its own binary, or PTX compiled for it) answers, for the instantiation
// the forward launch would take. Under the HIP CPU runtime that is the body compiled in: an emulated WMMA/MFMA
// variant answers wmma/mfma (and the WMMA one tf32 for FP32), the plain one simt, the sm80 one sm80 (simt with
// SPCONV_FUSED_SM80=0).
template <bool Pipelined>
__global__ void forward_body_kernel(int32_t* out) {
#if defined(SPCONV_DEVICE_WMMA)
  out[1] = 1;
#else
  out[1] = 0;
#endif
#if defined(SPCONV_FORWARD_SM80)
  if (Pipelined) {
    out[0] = 3;
    return;
  }
#endif
#if defined(SPCONV_DEVICE_WMMA)
  out[0] = 1;
#elif defined(SPCONV_DEVICE_MFMA)
  out[0] = 2;
#else
  out[0] = 0;
#endif
}
}  // namespace

int fused_forward_body(int32_t* out, void* stream) {
  auto kernel = &forward_body_kernel<false>;
  if constexpr (kHasPipelined)
    if (fused_pipelined()) kernel = &forward_body_kernel<true>;
  launch_kernel(kernel, dim3(1), dim3(1), 0, static_cast<hipStream_t>(stream), out);
  return last_launch_error();
}

const char* fused_body_name(DType t, const int32_t* body, bool tf32) {
  if (t == DType::F32) return body[1] && fused_tf32(tf32) ? "tf32" : "simt";
  return body[0] == 1 ? "wmma" : body[0] == 2 ? "mfma" : body[0] == 3 ? "sm80" : "simt";
}

}  // namespace gpu
}  // namespace spconv
