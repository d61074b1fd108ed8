// Pipelined tensor-core forward body of the fused conv (NVIDIA sm_80+, fp16 / bf16): part of fused_conv.cu,
// included inside its namespace after the shared prologue helpers (FwdArgs, TileState, tile_prologue, ...),
// with tc_sm80.h's instructions (real PTX, or the emulators of the sm80 HIP-CPU variant).
//
// Same tile, launch shape and K order as the SIMT body: 64 output rows x 64 channels per block, 256 threads,
// the active kernel offsets in order, each in 32-channel steps (zero-padded past cin). A K step's gathered
// rows and filter slice are copied global -> shared with cp.async into one of kStages stages, kStages - 1
// steps ahead of the step being multiplied; each thread copies the same 16 bytes of A (row tid / 4) and of B
// at every step, so it keeps its row's neighbour index in a register and reads the next active offset's index
// one offset ahead. Rows padded by 8 elements (16 bytes): the eight row addresses of an ldmatrix fall in
// distinct bank groups. 8 warps as 2 (rows) x 4 (channels), a 32 x 16 warp tile: per 16-deep slice two
// ldmatrix.x4 of A, one ldmatrix.x4.trans of B and four mma.sync m16n8k16 into fp32 accumulators, stored
// straight from registers. Where the 16-byte copies are not allowed (a.vec == 0) the same thread writes the
// same elements with ordinary loads and stores, in the same pipeline.
// One barrier per K step: after it, step i's data is visible (each thread waited for its own copies before)
// and stage (i - 1) % kStages is no longer read, so the copies of step i + kStages - 1 go there.

constexpr int kStages = 4;
constexpr int kLdA = BK + 8, kLdB = BN + 8;  // padded row strides (elements)

struct Sm80Tiles {
  uint16_t a[kStages][BM][kLdA];
  uint16_t b[kStages][BK][kLdB];
};

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

// Issues the copies of the K steps in order; each thread owns one 16-byte piece (8 elements) of the A tile
// (row ar, channels akk..) and of the B tile (row bkk, channels bn..) at every step.
struct Sm80Issuer {
  OffsetWalk cur, next;     // offset of the step to issue next, and the active offset after it
  int c0;                   // its first channel
  int32_t src_next;         // neighbour of this thread's A row at next.k (read one offset ahead)
  int32_t row;              // this thread's A row (an output row, -1 past the end)
  const uint16_t* pa;       // x[src][c0 + akk] (meaningless without a neighbour)
  bool a_live;              // this thread's A row has a neighbour at cur.k
  const uint16_t* pb;       // w[k][c0 + bkk][n0 + bn]
  bool col_ok;              // n0 + bn < cout
  int ar, akk, bkk, bn;
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
  is.pa = x + int64_t(src >= 0 ? src : 0) * a.cin + is.akk;
  is.pb = w + (int64_t(is.cur.k) * a.cin + is.bkk) * a.cout + int64_t(blockIdx.y) * BN + is.bn;
}

template <bool Vec>
__device__ __forceinline__ void sm80_issue(const FwdArgs& a, unsigned int mask, Sm80Issuer& is, uint16_t (*As)[kLdA],
                                           uint16_t (*Bs)[kLdB]) {
  const int cin = static_cast<int>(a.cin);  // launch_forward refuses cin past int
  const bool a_ok = is.a_live && is.c0 + is.akk < cin, b_ok = is.col_ok && is.c0 + is.bkk < cin;
  if constexpr (Vec) {  // cin, cout multiples of 8: a piece is wholly inside or wholly out
    tc::cp_async<16>(&As[is.ar][is.akk], a_ok ? is.pa : static_cast<const uint16_t*>(a.x), a_ok ? 16 : 0);
    tc::cp_async<16>(&Bs[is.bkk][is.bn], b_ok ? is.pb : static_cast<const uint16_t*>(a.w), b_ok ? 16 : 0);
  } else {
    const int64_t col = int64_t(blockIdx.y) * BN + is.bn;
    for (int e = 0; e < 8; ++e) {
      As[is.ar][is.akk + e] = (a_ok && is.c0 + is.akk + e < cin) ? is.pa[e] : uint16_t(0);
      Bs[is.bkk][is.bn + e] = (is.c0 + is.bkk < cin && col + e < a.cout) ? is.pb[e] : uint16_t(0);
    }
  }
  is.c0 += BK;
  is.pa += BK;
  is.pb += int64_t(BK) * a.cout;
  if (is.c0 >= cin) {  // on to the next active offset, whose neighbour was read one offset ago
    is.cur = is.next;
    issuer_at_offset(a, is, is.src_next);
    walk_next(a, mask, is.next);
    is.src_next = neighbour(a, is.row, is.next.k);
  }
}

// acc[mi][nj] += the warp's 32x16 slice of A (rows wr..) times B (cols wc..) over one 16-deep slice at ks.
template <typename T>
__device__ __forceinline__ void sm80_slice(const uint16_t (*As)[kLdA], const uint16_t (*Bs)[kLdB], int wr, int wc,
                                           int ks, int lane, float (&acc)[2][2][4]) {
  const int i = lane / 8, j = lane % 8;  // this lane addresses row j of matrix i
  uint32_t af[2][4], bf[4];
  for (int mi = 0; mi < 2; ++mi)  // matrices: rows 0-7 / 8-15 (i % 2) x k 0-7 / 8-15 (i / 2): A's registers
    tc::ldmatrix<4, false>(af[mi], &As[wr + 16 * mi + j + 8 * (i % 2)][ks + 8 * (i / 2)]);
  // B stored [k][n]: transposed loads of k 0-7 / 8-15 (i % 2) x n 0-7 / 8-15 (i / 2) give each n8 tile's two
  // registers (bf[2 nj], bf[2 nj + 1]).
  tc::ldmatrix<4, true>(bf, &Bs[ks + j + 8 * (i % 2)][wc + 8 * (i / 2)]);
  for (int mi = 0; mi < 2; ++mi)
    for (int nj = 0; nj < 2; ++nj) {
      const uint32_t b2[2] = {bf[2 * nj], bf[2 * nj + 1]};
      tc::mma_m16n8k16<T>(acc[mi][nj], af[mi], b2);
    }
}

// The body for one kind of tile copy (Vec: cp.async), so that the main loop holds only that one.
template <typename T, bool Vec>
__device__ __forceinline__ void forward_sm80_loop(const FwdArgs& a, TileState& st, Sm80Tiles& sm) {
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int wr = (warp / 4) * 32, wc = (warp % 4) * 16;
  const unsigned int mask = tile_prologue(a, st);
  // K steps of this tile: every active offset times the 32-channel steps (the same count in every thread).
  const int chunks = static_cast<int>((a.cin + BK - 1) / BK);
  int active = 0;
  for (int k = a.k0; k < a.k1; ++k) active += offset_active(a, mask, k) ? 1 : 0;
  const int steps = active * chunks;

  Sm80Issuer is;
  is.ar = tid / (BK / 8);
  is.akk = (tid % (BK / 8)) * 8;
  is.bkk = tid / (BN / 8);
  is.bn = (tid % (BN / 8)) * 8;
  is.col_ok = int64_t(blockIdx.y) * BN + is.bn < a.cout;
  is.row = st.rows[is.ar];
  walk_group(a, mask, is.cur, 0);
  is.next = is.cur;
  walk_next(a, mask, is.next);
  issuer_at_offset(a, is, neighbour(a, is.row, is.cur.k));
  is.src_next = neighbour(a, is.row, is.next.k);

  for (int s = 0; s < kStages - 1; ++s) {
    if (s < steps) sm80_issue<Vec>(a, mask, is, sm.a[s], sm.b[s]);
    tc::cp_async_commit();  // empty groups keep the count of groups per step uniform
  }
  float acc[2][2][4] = {};
  for (int i = 0; i < steps; ++i) {
    tc::cp_async_wait_group<kStages - 2>();  // this thread's copies of step i have landed
    __syncthreads();                          // everyone's have; step i - 1's stage is free
    const int next = i + kStages - 1;
    if (next < steps) sm80_issue<Vec>(a, mask, is, sm.a[next % kStages], sm.b[next % kStages]);
    tc::cp_async_commit();
    const int s = i % kStages;
#pragma unroll
    for (int ks = 0; ks < BK; ks += 16) sm80_slice<T>(sm.a[s], sm.b[s], wr, wc, ks, lane, acc);
  }
  tc::cp_async_wait_all();
  // Accumulator element q of tile (mi, nj): row g + 8 (q / 2), column 2 t + q % 2 of the 16x8 tile.
  const int g = lane / 4, t = lane % 4;
  const int64_t n0 = int64_t(blockIdx.y) * BN;
  for (int mi = 0; mi < 2; ++mi)
    for (int q2 = 0; q2 < 2; ++q2) {
      const int32_t row = st.rows[wr + 16 * mi + g + 8 * q2];
      if (row < 0) continue;
      for (int nj = 0; nj < 2; ++nj)
        for (int q1 = 0; q1 < 2; ++q1) {
          const int64_t col = n0 + wc + 8 * nj + 2 * t + q1;
          if (col < a.cout) store_output<T>(a, row, col, acc[mi][nj][2 * q2 + q1]);
        }
    }
}

template <typename T>
__device__ void forward_sm80(const FwdArgs& a) {
  __shared__ TileState st;
  __shared__ __attribute__((aligned(16))) Sm80Tiles sm;  // one copy for both loops (static shared memory)
  if (a.vec)
    forward_sm80_loop<T, true>(a, st, sm);
  else
    forward_sm80_loop<T, false>(a, st, sm);
}
