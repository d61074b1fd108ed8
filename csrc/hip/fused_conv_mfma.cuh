// Pipelined MFMA forward body of the fused conv (AMD gfx90a / gfx94x, fp16 / bf16, wave64): part of
// fused_conv.cu, included inside its namespace after the shared helpers (FwdArgs, TileState, tile_prologue,
// offset_active, table_column, store_tile, the mfma_* types and mfma_store).
//
// Same tile, launch shape and K order as the SIMT body: 64 output rows x 64 channels, 256 threads = 4 waves, each
// a 16 x 64 slice; the active offsets in order, 32 channels per K step, two 16-deep MFMAs per step and column
// fragment. So under the HIP CPU emulator it gives the SIMT body's bits.
// Pipeline: each thread fetches the same two 16-byte pieces at every step, one of the gathered A tile (row
// tid / 4) and one of the filter slice (k row tid / 8), into registers. The next step's pieces are fetched
// before this step's multiplies and stored into the other of two LDS buffers after them: global loads run a
// step ahead, one barrier per step. A is stored [row][k] and B transposed, [n][k], so each operand (four
// consecutive k of one row or column) is one 64-bit LDS read. Each thread reads its own row's neighbour from
// the table when the offset changes, so a new offset needs no block barrier; the steps within an offset are an
// inner loop of loads, LDS reads and writes, MFMAs and one barrier.
// Every wave multiplies at every step, rows with a source or not: a branch around the MFMAs makes ROCm's
// compiler copy the accumulators between matrix and vector registers at every step (32 moves for 8 MFMAs),
// which costs more than the multiplies a wave without sources would skip.

constexpr int kMfmaLd = BK + 4;  // row stride (elements) of both tiles: 72 bytes, rows 8-byte aligned

struct MfmaBuffer {
  uint16_t a[BM][kMfmaLd];   // gathered rows, [row][k]
  uint16_t bt[BN][kMfmaLd];  // filter slice transposed, [n][k]
};

union alignas(16) MfmaShared {
  MfmaBuffer buf[2];
  float c[BM][BN + 4];  // the epilogue's tile, after the last step
};

// One thread's pieces of a K step, in registers between their fetch and their store.
struct MfmaPieces {
  uint4 a, b;
};

// Issues the K steps in order (the active offsets, 32 channels at a time); the thread's pieces are the same at
// every step: A row ar, channels akk..akk+7 of the step; B k row bkk, columns bn..bn+7 of the tile.
struct MfmaIssuer {
  OffsetWalk off;     // offset of the step to fetch next (a.k1: none left)
  int c0;             // its first channel
  int32_t row, src;   // this thread's A row and its neighbour at off.k
  const uint16_t* pa; // x[src][c0 + akk] (meaningless without a neighbour)
  const uint16_t* pb; // w[off.k][c0 + bkk][col]
  int akk, bkk;
  bool col_ok;        // col < cout
};

__device__ __forceinline__ void mfma_at_offset(const FwdArgs& a, MfmaIssuer& is) {
  const int64_t col = int64_t(blockIdx.y) * BN + (threadIdx.x % 8) * 8;
  is.c0 = 0;
  is.src = (is.row >= 0 && is.off.k < a.k1) ? a.nbr[int64_t(is.row) * a.kvol + table_column(a, is.off.k)] : -1;
  is.pa = static_cast<const uint16_t*>(a.x) + int64_t(is.src >= 0 ? is.src : 0) * a.cin + is.akk;
  is.pb = static_cast<const uint16_t*>(a.w) + (int64_t(is.off.k) * a.cin + is.bkk) * a.cout + col;
}

__device__ __forceinline__ void mfma_issuer_init(const FwdArgs& a, const TileState& st, unsigned int mask,
                                                 MfmaIssuer& is) {
  const int tid = threadIdx.x;
  is.akk = (tid % 4) * 8;
  is.bkk = tid / 8;
  is.col_ok = int64_t(blockIdx.y) * BN + (tid % 8) * 8 < a.cout;
  is.row = st.rows[tid / 4];
  walk_group(a, mask, is.off, 0);
  mfma_at_offset(a, is);
}

// 8 elements from p where ok (Vec: cin, cout multiples of 8, so a piece is wholly inside or out; else each
// element up to `left` of them).
template <bool Vec>
__device__ __forceinline__ uint4 mfma_piece(const uint16_t* p, bool ok, int left) {
  if (Vec) return ok ? *reinterpret_cast<const uint4*>(p) : make_uint4(0u, 0u, 0u, 0u);
  uint32_t v[4];
  for (int i = 0; i < 4; ++i) {
    const uint32_t lo = (ok && 2 * i < left) ? p[2 * i] : 0u, hi = (ok && 2 * i + 1 < left) ? p[2 * i + 1] : 0u;
    v[i] = lo | (hi << 16);
  }
  return make_uint4(v[0], v[1], v[2], v[3]);
}

// The pieces of the issuer's step (channels is.c0.. of offset is.off.k).
template <bool Vec>
__device__ __forceinline__ void mfma_fetch(const FwdArgs& a, const MfmaIssuer& is, MfmaPieces& p) {
  const int cin = static_cast<int>(a.cin);  // launch_forward refuses cin past int
  const int ca = is.c0 + is.akk, cb = is.c0 + is.bkk;
  const int cols = static_cast<int>(a.cout - (int64_t(blockIdx.y) * BN + (threadIdx.x % 8) * 8));
  p.a = mfma_piece<Vec>(is.pa, is.src >= 0 && ca < cin, cin - ca);
  p.b = mfma_piece<Vec>(is.pb, is.col_ok && cb < cin, cols);
}

// The next 32 channels of the issuer's offset.
__device__ __forceinline__ void mfma_next_channels(const FwdArgs& a, MfmaIssuer& is) {
  is.c0 += BK;
  is.pa += BK;
  is.pb += int64_t(BK) * a.cout;
}

__device__ __forceinline__ void mfma_stash(const MfmaPieces& p, MfmaBuffer& b) {
  const int tid = threadIdx.x, ar = tid / 4, akk = (tid % 4) * 8, bkk = tid / 8, bn = (tid % 8) * 8;
  uint2* da = reinterpret_cast<uint2*>(&b.a[ar][akk]);
  da[0] = make_uint2(p.a.x, p.a.y);
  da[1] = make_uint2(p.a.z, p.a.w);
  const uint32_t v[4] = {p.b.x, p.b.y, p.b.z, p.b.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {  // column bn + 2 i is the low half of v[i], bn + 2 i + 1 the high half
    b.bt[bn + 2 * i][bkk] = static_cast<uint16_t>(v[i]);
    b.bt[bn + 2 * i + 1][bkk] = static_cast<uint16_t>(v[i] >> 16);
  }
}

// acc[f] += the wave's 16 rows x the 16 columns of fragment f, over the step's 32 channels.
template <typename T>
__device__ __forceinline__ void mfma_multiply(const MfmaBuffer& b, int wave, int lr, int lq, mfma_float4 (&acc)[4]) {
#pragma unroll
  for (int ks = 0; ks < BK; ks += 16) {
    const mfma_short4 av = *reinterpret_cast<const mfma_short4*>(&b.a[wave * 16 + lr][ks + 4 * lq]);
#pragma unroll
    for (int f = 0; f < 4; ++f) {
      const mfma_short4 bv = *reinterpret_cast<const mfma_short4*>(&b.bt[f * 16 + lr][ks + 4 * lq]);
      if constexpr (std::is_same<T, __half>::value) {
        mfma_half4 ah, bh;
        __builtin_memcpy(&ah, &av, sizeof(ah));
        __builtin_memcpy(&bh, &bv, sizeof(bh));
        acc[f] = __builtin_amdgcn_mfma_f32_16x16x16f16(ah, bh, acc[f], 0, 0, 0);
      } else {
        acc[f] = __builtin_amdgcn_mfma_f32_16x16x16bf16_1k(av, bv, acc[f], 0, 0, 0);
      }
    }
  }
}

template <typename T, bool Vec>
__device__ __forceinline__ void forward_mfma_loop(const FwdArgs& a, TileState& st, MfmaShared& sm) {
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64, lr = lane % 16, lq = lane / 16;
  const int cin = static_cast<int>(a.cin);
  const unsigned int mask = tile_prologue(a, st);
  mfma_float4 acc[4];
  for (int f = 0; f < 4; ++f) acc[f] = mfma_float4{0.f, 0.f, 0.f, 0.f};
  MfmaIssuer is;
  mfma_issuer_init(a, st, mask, is);
  if (is.off.k < a.k1) {  // (the same in every thread, as every count and branch below)
    MfmaPieces p;
    mfma_fetch<Vec>(a, is, p);
    mfma_stash(p, sm.buf[0]);
    mfma_next_channels(a, is);
    __syncthreads();
    int b = 0;
    for (;;) {
      if (is.c0 >= cin) {  // on to the next active offset (or none)
        walk_next(a, mask, is.off);
        mfma_at_offset(a, is);
        if (is.off.k >= a.k1) break;
      }
      // The steps whose loads stay in this offset: each fetches the next step before multiplying this one.
      for (const int end = cin; is.c0 < end; b ^= 1) {
        mfma_fetch<Vec>(a, is, p);
        mfma_next_channels(a, is);
        mfma_multiply<T>(sm.buf[b], wave, lr, lq, acc);
        mfma_stash(p, sm.buf[b ^ 1]);  // last read one step ago, before the barrier that ended that step
        __syncthreads();
      }
    }
    mfma_multiply<T>(sm.buf[b], wave, lr, lq, acc);  // the last step
    __syncthreads();  // every wave is done with the buffers the epilogue's tile overlaps
  }
  mfma_store(acc, sm.c, wave, lr, lq);
  store_tile<T>(a, st, &sm.c[0][0], BN + 4);
}

template <typename T>
__device__ void forward_mfma(const FwdArgs& a) {
  __shared__ TileState st;
  __shared__ MfmaShared sm;
  if (a.vec)
    forward_mfma_loop<T, true>(a, st, sm);
  else
    forward_mfma_loop<T, false>(a, st, sm);
}
