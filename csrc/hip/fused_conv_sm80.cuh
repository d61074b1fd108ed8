// Pipelined tensor-core forward body of the fused conv (NVIDIA sm_80+, fp16 / bf16): part of fused_conv.cu,
// included inside its namespace after the shared prologue helpers (FwdArgs, TileState, tile_prologue, ...),
// with tc_sm80.h's instructions (real PTX, or the emulators of the sm80 HIP-CPU variant).
//
// Same tile, launch shape and K order as the SIMT body: 64 output rows x 64 channels per block, 256 threads,
// the active kernel offsets in order, each in steps of TK channels (zero-padded past cin; the SIMT body's
// 32-channel steps in the same order). A K step's gathered rows and filter slice are copied global -> shared
// with cp.async into one of S stages, S - 1 steps ahead of the step being multiplied; each thread copies the
// same TK / 32 16-byte pieces of A (one row) and of B (one row) at every step, so it keeps its row's neighbour
// index in a register and reads the next active offset's index one offset ahead.
// Rows padded by 8 elements (16 bytes): the eight row addresses of an ldmatrix fall in distinct bank groups.
// 8 warps as 4 (rows) x 2 (channels), a 16 x 32 warp tile: per 16-deep slice one ldmatrix.x4 of A, two
// ldmatrix.x4.trans of B and four mma.sync m16n8k16 into fp32 accumulators, stored straight from registers.
// Idle row groups: a warp copies pieces of its own 16 rows (each row by two lanes), so one vote when the offset
// changes says whether any of them has a source there; a step whose rows have none skips its multiplies (they
// would add exact zeros). The vote travels with the step through a shift register, S - 1 steps behind the copies.
// Where the 16-byte copies are not allowed (a.vec == 0) the same thread writes the same elements with ordinary
// loads and stores, in the same pipeline.
// One barrier per K step: after it, step i's data is visible (each thread waited for its own copies before)
// and stage (i - 1) % S is no longer read, so the copies of step i + S - 1 go there. The step loop only copies
// within one offset; the move to the next offset (neighbour read, pointers) runs between its runs.

// K step shapes (static shared memory stays under 48 KiB): 32-channel steps in 4 stages, or 64-channel steps
// in 2 stages (the same shared memory; twice the MMAs per barrier and per copy issue, copies one step ahead
// instead of three). A stage holds both tiles, so one offset per stage addresses both.
template <int TK>
struct Sm80Stage {
  static constexpr int kLdA = TK + 8, kLdB = BN + 8;  // padded row strides (elements)
  uint16_t a[BM][kLdA];
  uint16_t b[TK][kLdB];
};
template <int TK, int S>
struct Sm80Tiles {
  using Stage = Sm80Stage<TK>;
  static constexpr int kK = TK, kStages = S, kLdA = Stage::kLdA, kLdB = Stage::kLdB;
  static constexpr int kPieces = TK / 32;  // 16-byte pieces of A (adjacent) and of B (32 apart) per thread and step
  Stage stage[S];
};
using Sm80Shallow = Sm80Tiles<32, 4>;
using Sm80Deep = Sm80Tiles<64, 2>;
static_assert(BM == 64 && BN == 64 && kThreads == 256, "A: 8 warps of 16 rows x TK / 2 channels; B: 8 / pieces "
              "threads per row");

// The deep K step where it adds no padding to the 32-channel steps (an even count of them), or at most one
// padding step to five or more (every cin > 96).
__device__ __forceinline__ bool sm80_deep_k(int cin) {
  const int c32 = (cin + 31) / 32;
  return c32 % 2 == 0 || c32 > 4;
}

// Issues the copies of the K steps in order; each thread owns the same pieces of the A tile (row ar, channels
// akk + 8 p: a row of its warp's row group) and of the B tile (row bkk, channels bn + 32 p) at every step. Tile
// addresses are byte offsets in stage 0 (a stage's offset is added per step).
struct Sm80Issuer {
  OffsetWalk cur, next;     // offset of the step to issue next, and the active offset after it
  int c0;                   // its first channel
  int32_t src_next;         // neighbour of this thread's A row at next.k (read one offset ahead)
  int32_t row;              // this thread's A row (an output row, -1 past the end)
  const uint16_t* pa;       // x[src][c0 + akk] (meaningless without a neighbour)
  bool a_live;              // this thread's A row has a neighbour at cur.k
  bool busy;                // some row of this warp's row group has one
  const uint16_t* pb;       // w[k][c0 + bkk][n0 + bn]
  bool col_ok[2];           // n0 + bn + 32 p < cout
  int ar, akk, bkk, bn;
  uint32_t da, db;          // &As[ar][akk], &Bs[bkk][bn] in stage 0
};

__device__ __forceinline__ int32_t neighbour(const FwdArgs& a, int32_t row, int k) {
  return (row >= 0 && k < a.k1) ? a.nbr[int64_t(row) * a.kvol + table_column(a, k)] : -1;
}

// Points the issuer at channel 0 of offset cur.k with neighbour src.
__device__ __forceinline__ void issuer_at_offset(const FwdArgs& a, Sm80Issuer& is, int32_t src) {
  const uint16_t* x = static_cast<const uint16_t*>(a.x);
  const uint16_t* w = static_cast<const uint16_t*>(a.w);
  is.c0 = 0;
  is.a_live = src >= 0;
  is.busy = tc::warp_any(is.a_live);
  is.pa = x + int64_t(src >= 0 ? src : 0) * a.cin + is.akk;
  is.pb = w + (int64_t(is.cur.k) * a.cin + is.bkk) * a.cout + int64_t(blockIdx.y) * BN + is.bn;
}

// On to the next active offset, whose neighbour was read one offset ago.
__device__ __forceinline__ void issuer_next_offset(const FwdArgs& a, unsigned int mask, Sm80Issuer& is) {
  is.cur = is.next;
  issuer_at_offset(a, is, is.src_next);
  walk_next(a, mask, is.next);
  is.src_next = neighbour(a, is.row, is.next.k);
}

template <typename Tiles>
__device__ __forceinline__ void issuer_init(const FwdArgs& a, const TileState& st, unsigned int mask,
                                            Sm80Issuer& is) {
  constexpr int kRowThreads = 8 / Tiles::kPieces;  // threads per B row
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  is.ar = (warp / 2) * 16 + lane / 2;  // the row group the warp multiplies (sm80_warp_tile), two lanes a row
  is.akk = (warp % 2) * (Tiles::kK / 2) + (lane % 2) * (Tiles::kK / 4);
  is.bkk = tid / kRowThreads;
  is.bn = (tid % kRowThreads) * 8;
  for (int p = 0; p < 2; ++p) is.col_ok[p] = int64_t(blockIdx.y) * BN + is.bn + 32 * p < a.cout;
  is.da = static_cast<uint32_t>(offsetof(typename Tiles::Stage, a)) + (is.ar * Tiles::kLdA + is.akk) * 2u;
  is.db = static_cast<uint32_t>(offsetof(typename Tiles::Stage, b)) + (is.bkk * Tiles::kLdB + is.bn) * 2u;
  is.row = st.rows[is.ar];
  walk_group(a, mask, is.cur, 0);
  is.next = is.cur;
  walk_next(a, mask, is.next);
  issuer_at_offset(a, is, neighbour(a, is.row, is.cur.k));
  is.src_next = neighbour(a, is.row, is.next.k);
}

// The copies of one K step (channels c0.. of the current offset) into the stage at `stage`, then the issuer
// moves TK channels on. With src-size 0 a cp.async reads nothing, so its source needs no substitute.
template <typename Tiles, bool Vec>
__device__ __forceinline__ void sm80_copy(const FwdArgs& a, Sm80Issuer& is, unsigned char* stage) {
  const int cin = static_cast<int>(a.cin);  // launch_forward refuses cin past int
  const bool b_k_ok = is.c0 + is.bkk < cin;
#pragma unroll
  for (int p = 0; p < Tiles::kPieces; ++p) {
    const int ca = is.c0 + is.akk + 8 * p;
    const bool a_ok = is.a_live && ca < cin, b_ok = is.col_ok[p] && b_k_ok;
    uint16_t* da = reinterpret_cast<uint16_t*>(stage + is.da) + 8 * p;
    uint16_t* db = reinterpret_cast<uint16_t*>(stage + is.db) + 32 * p;
    if constexpr (Vec) {  // cin, cout multiples of 8: a piece is wholly inside or wholly out
      tc::cp_async<16>(da, is.pa + 8 * p, a_ok ? 16 : 0);
      tc::cp_async<16>(db, is.pb + 32 * p, b_ok ? 16 : 0);
    } else {
      const int64_t col = int64_t(blockIdx.y) * BN + is.bn + 32 * p;
      for (int e = 0; e < 8; ++e) {
        da[e] = (a_ok && ca + e < cin) ? is.pa[8 * p + e] : uint16_t(0);
        db[e] = (b_k_ok && col + e < a.cout) ? is.pb[32 * p + e] : uint16_t(0);
      }
    }
  }
  is.c0 += Tiles::kK;
  is.pa += Tiles::kK;
  is.pb += int64_t(Tiles::kK) * a.cout;
}

// One K step's multiplies out of `stage`: per 16-deep slice, acc[nj] += the warp's 16-row slice of A (rows
// wr..) times the n8 tile nj of B (cols wc + 8 nj..). fa, fb: this lane's ldmatrix rows in stage 0 (see
// sm80_fragment_rows). Skipped when none of the warp's rows has a source at the step's offset (tc::kSkipByBranch).
template <typename T, typename Tiles>
__device__ __forceinline__ void sm80_multiply(const unsigned char* stage, uint32_t fa, uint32_t fb, bool busy,
                                              float (&acc)[4][4]) {
  if (tc::kSkipByBranch && !busy) return;
  float scratch[4][4] = {};
  float(&out)[4][4] = busy ? acc : scratch;
  const uint16_t* As = reinterpret_cast<const uint16_t*>(stage + fa);
  const uint16_t* Bs = reinterpret_cast<const uint16_t*>(stage + fb);
#pragma unroll
  for (int ks = 0; ks < Tiles::kK; ks += 16) {
    uint32_t af[4], bf[2][4];
    tc::ldmatrix<4, false>(af, As + ks);
#pragma unroll
    for (int h = 0; h < 2; ++h) tc::ldmatrix<4, true>(bf[h], Bs + ks * Tiles::kLdB + 16 * h);
#pragma unroll
    for (int nj = 0; nj < 4; ++nj) {
      const uint32_t b2[2] = {bf[nj / 2][2 * (nj % 2)], bf[nj / 2][2 * (nj % 2) + 1]};
      tc::mma_m16n8k16<T>(out[nj], af, b2);
    }
  }
}

// This lane's ldmatrix rows (byte offsets in stage 0). A: matrices rows 0-7 / 8-15 (i % 2) x k 0-7 / 8-15
// (i / 2) give A's registers. B stored [k][n]: transposed loads of k 0-7 / 8-15 (i % 2) x n 0-7 / 8-15 (i / 2)
// give the two registers of the n8 tiles 0 and 1; the second load, 16 columns on, those of tiles 2 and 3.
template <typename Tiles>
__device__ __forceinline__ void sm80_fragment_rows(int wr, int wc, int lane, uint32_t& fa, uint32_t& fb) {
  const int i = lane / 8, j = lane % 8;  // this lane addresses row j of matrix i
  fa = static_cast<uint32_t>(offsetof(typename Tiles::Stage, a)) +
       ((wr + j + 8 * (i % 2)) * Tiles::kLdA + 8 * (i / 2)) * 2u;
  fb = static_cast<uint32_t>(offsetof(typename Tiles::Stage, b)) +
       ((j + 8 * (i % 2)) * Tiles::kLdB + wc + 8 * (i / 2)) * 2u;
}

// Step i's copies have landed for every thread, and stage (i - 1) % S is no longer read.
template <int S>
__device__ __forceinline__ void sm80_step_wait() {
  tc::cp_async_wait_group<S - 2>();  // this thread's copies of step i have landed
  __syncthreads();                   // everyone's have; step i - 1's stage is free
}

// Accumulator element q of n8 tile nj: row g + 8 (q / 2), column 2 t + q % 2 of the 16x8 tile. Unrolled with
// constant indices, so the accumulators stay in registers.
template <typename T>
__device__ __forceinline__ void sm80_store(const FwdArgs& a, const TileState& st, int wr, int wc, int lane,
                                           const float (&acc)[4][4]) {
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.y) * BN;
#pragma unroll
  for (int q2 = 0; q2 < 2; ++q2) {
    const int32_t row = st.rows[wr + g + 8 * q2];
#pragma unroll
    for (int nj = 0; nj < 4; ++nj)
#pragma unroll
      for (int q1 = 0; q1 < 2; ++q1) {
        const int64_t col = n0 + wc + 8 * nj + 2 * t + q1;
        if (row >= 0 && col < a.cout) store_output<T>(a, row, col, acc[nj][2 * q2 + q1]);
      }
  }
}

// The body for one K step shape and one kind of tile copy (Vec: cp.async), so that the loop holds only those.
template <typename T, typename Tiles, bool Vec>
__device__ __forceinline__ void forward_sm80_loop(const FwdArgs& a, TileState& st, unsigned char* sm) {
  constexpr int TK = Tiles::kK, S = Tiles::kStages;
  constexpr uint32_t kStage = sizeof(typename Tiles::Stage);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int wr = (warp / 2) * 16, wc = (warp % 2) * 32;
  const unsigned int mask = tile_prologue(a, st);
  // K steps of this tile: every active offset times the TK-channel steps (the same count in every thread).
  const int cin = static_cast<int>(a.cin);
  const int chunks = (cin + TK - 1) / TK;
  int active = 0;
  for (int k = a.k0; k < a.k1; ++k) active += offset_active(a, mask, k) ? 1 : 0;
  const int steps = active * chunks;

  Sm80Issuer is;
  issuer_init<Tiles>(a, st, mask, is);
  uint32_t fa, fb;
  sm80_fragment_rows<Tiles>(wr, wc, lane, fa, fb);

  // busy: bit j holds the warp's vote for the step issued j copies ago, so the step being multiplied (issued
  // S - 1 copies before the newest) reads bit S - 1. A copy shifts in its step's vote, a step without one a 0.
  unsigned int busy = 0u;
  for (int s = 0; s < S - 1; ++s) {
    busy <<= 1;
    if (s < steps) {
      busy |= is.busy ? 1u : 0u;
      sm80_copy<Tiles, Vec>(a, is, sm + s * kStage);
      if (is.c0 >= cin) issuer_next_offset(a, mask, is);
    }
    tc::cp_async_commit();  // empty groups keep the count of groups per step uniform
  }
  constexpr unsigned int kDue = 1u << (S - 1);
  float acc[4][4] = {};
  unsigned int i = 0;  // unsigned: i % S is a mask
  // Runs of steps whose copies (S - 1 steps ahead) stay in the issuer's offset (the same run in every thread).
  while (int(i) + S - 1 < steps) {
    const int left = (cin - is.c0 + TK - 1) / TK, rest = steps - (int(i) + S - 1);
    const int run = left < rest ? left : rest;
    for (int r = 0; r < run; ++r, ++i) {
      sm80_step_wait<S>();
      busy = (busy << 1) | (is.busy ? 1u : 0u);
      sm80_copy<Tiles, Vec>(a, is, sm + (i + S - 1) % S * kStage);
      tc::cp_async_commit();
      sm80_multiply<T, Tiles>(sm + i % S * kStage, fa, fb, (busy & kDue) != 0u, acc);
    }
    if (is.c0 >= cin) issuer_next_offset(a, mask, is);
  }
  for (; int(i) < steps; ++i) {  // the last S - 1 steps: nothing left to copy
    sm80_step_wait<S>();
    busy <<= 1;
    tc::cp_async_commit();
    sm80_multiply<T, Tiles>(sm + i % S * kStage, fa, fb, (busy & kDue) != 0u, acc);
  }
  tc::cp_async_wait_all();
  sm80_store<T>(a, st, wr, wc, lane, acc);
}

template <typename T, bool Vec>
__device__ __forceinline__ void forward_sm80_shape(const FwdArgs& a, TileState& st, unsigned char* sm) {
  if (sm80_deep_k(static_cast<int>(a.cin)))
    forward_sm80_loop<T, Sm80Deep, Vec>(a, st, sm);
  else
    forward_sm80_loop<T, Sm80Shallow, Vec>(a, st, sm);
}

template <typename T>
__device__ void forward_sm80(const FwdArgs& a) {
  constexpr size_t kBytes = sizeof(Sm80Deep) > sizeof(Sm80Shallow) ? sizeof(Sm80Deep) : sizeof(Sm80Shallow);
  __shared__ TileState st;
  __shared__ __attribute__((aligned(16))) unsigned char sm[kBytes];  // one copy for every loop (static)
  if (a.vec)
    forward_sm80_shape<T, true>(a, st, sm);
  else
    forward_sm80_shape<T, false>(a, st, sm);
}
