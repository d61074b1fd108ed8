// Pipelined MFMA forward body of the fused conv (AMD gfx90a / gfx94x, fp16 / bf16, wave64): part of
// fused_conv.cu, included inside its namespace after the shared helpers (FwdArgs, TileState, tile_prologue,
// offset_active, table_column, store_tile, the mfma_* types and mfma_store).
//
// Same tile, launch shape and K order as the SIMT body: 64 output rows x 64 channels, 256 threads = 4 waves, each
// a 16 x 64 slice; the active offsets in order, each in K steps of TK channels zero-padded past cin (the SIMT
// body's 32-channel steps in the same order), 16-deep MFMAs. So under the HIP CPU emulator it gives the SIMT
// body's bits.
// Pipeline: each thread fetches the same TK / 32 pairs of 16-byte pieces at every step, of the gathered A tile
// (row tid / 4, channels 32 apart) and of the filter slice (k rows tid / 8 + 32 j), into registers. The next
// step's pieces are fetched before this step's multiplies and stored after them: global loads run a step ahead.
// Two K step shapes (mfma_deep_k): 32 channels in two LDS buffers, one barrier per step; or, for cin > 96 and
// even counts of 32, 64 channels in one buffer (the same LDS: twice the MFMAs per step and per barrier pair),
// with a barrier before the store as well. A is stored [row][k] and B transposed, [n][k], so each operand (four
// consecutive k of one row or column) is one 64-bit LDS read. Each thread reads its own row's neighbour from
// the table when the offset changes, so a new offset needs no block barrier; the steps within an offset are an
// inner loop of loads, LDS reads and writes, MFMAs and one barrier.
// Every wave multiplies at every step, rows with a source or not: a branch around the MFMAs makes ROCm's
// compiler copy the accumulators between matrix and vector registers at every step (32 moves for 8 MFMAs),
// which costs more than the multiplies a wave without sources would skip.

// K step shapes: TK channels per step, S LDS buffers (18 KiB either way, so three blocks fit a CU's 64 KiB).
template <int TK>
struct MfmaTile {
  static constexpr int kLd = TK + 4;  // row stride (elements): rows 8-byte aligned, operand reads spread over banks
  uint16_t a[BM][kLd];   // gathered rows, [row][k]
  uint16_t bt[BN][kLd];  // filter slice transposed, [n][k]
};
template <int TK, int S>
struct MfmaShape {
  static constexpr int kK = TK, kStages = S, kPieces = TK / 32;
  using Tile = MfmaTile<TK>;
};
using MfmaShallow = MfmaShape<32, 2>;
using MfmaDeep = MfmaShape<64, 1>;

union alignas(16) MfmaShared {  // one copy for both shapes (static shared memory adds up per function)
  MfmaTile<32> shallow[2];      // also the dfilter body's tile (K = a step's BP pairs)
  MfmaTile<64> deep[1];
  float c[BM][BN + 4];  // the epilogue's tile, after the last step
};

// The 64-channel step where it adds no padding to the 32-channel steps (an even count of them), or at most one
// padding step to five or more (every cin > 96): the sm_80 body's rule.
__device__ __forceinline__ bool mfma_deep_k(int cin) {
  const int c32 = (cin + 31) / 32;
  return c32 % 2 == 0 || c32 > 4;
}

// One thread's pieces of a K step, in registers between their fetch and their store.
template <int P>
struct MfmaPieces {
  uint4 a[P], b[P];
};

// Issues the K steps in order (the active offsets, TK channels at a time); the thread's pieces are the same at
// every step: A row tid / 4, channels akk + 32 j of the step; B k rows bkk + 32 j, columns bn..bn+7 of the tile.
struct MfmaIssuer {
  OffsetWalk off;     // offset of the step to fetch next (a.k1: none left)
  int c0;             // its first channel
  int32_t row, src;   // this thread's A row and its neighbour at off.k
  const uint16_t* pa; // x[src][c0 + akk] (meaningless without a neighbour)
  const uint16_t* pb; // w[off.k][c0 + bkk][col]
  int64_t col;        // the first of the thread's B columns
  int akk, bkk;
  bool col_ok;        // col < cout
};

__device__ __forceinline__ void mfma_at_offset(const FwdArgs& a, MfmaIssuer& is) {
  is.c0 = 0;
  is.src = (is.row >= 0 && is.off.k < a.k1) ? a.nbr[int64_t(is.row) * a.kvol + table_column(a, is.off.k)] : -1;
  is.pa = static_cast<const uint16_t*>(a.x) + int64_t(is.src >= 0 ? is.src : 0) * a.cin + is.akk;
  is.pb = static_cast<const uint16_t*>(a.w) + (int64_t(is.off.k) * a.cin + is.bkk) * a.cout + is.col;
}

__device__ __forceinline__ void mfma_issuer_init(const FwdArgs& a, const TileState& st, unsigned int mask,
                                                 MfmaIssuer& is) {
  const int tid = threadIdx.x;
  is.akk = (tid % 4) * 8;
  is.bkk = tid / 8;
  is.col = int64_t(blockIdx.y) * BN + (tid % 8) * 8;
  is.col_ok = is.col < a.cout;
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
template <bool Vec, int P>
__device__ __forceinline__ void mfma_fetch(const FwdArgs& a, const MfmaIssuer& is, MfmaPieces<P>& p) {
  const int cin = static_cast<int>(a.cin);  // launch_forward refuses cin past int
  const int cols = static_cast<int>(a.cout - is.col);
#pragma unroll
  for (int j = 0; j < P; ++j) {
    const int ca = is.c0 + is.akk + 32 * j, cb = is.c0 + is.bkk + 32 * j;
    p.a[j] = mfma_piece<Vec>(is.pa + 32 * j, is.src >= 0 && ca < cin, cin - ca);
    p.b[j] = mfma_piece<Vec>(is.pb + int64_t(32 * j) * a.cout, is.col_ok && cb < cin, cols);
  }
}

// The next TK channels of the issuer's offset.
template <int TK>
__device__ __forceinline__ void mfma_next_channels(const FwdArgs& a, MfmaIssuer& is) {
  is.c0 += TK;
  is.pa += TK;
  is.pb += int64_t(TK) * a.cout;
}

template <int TK, int P>
__device__ __forceinline__ void mfma_stash(const MfmaPieces<P>& p, MfmaTile<TK>& b) {
  const int tid = threadIdx.x, ar = tid / 4, akk = (tid % 4) * 8, bkk = tid / 8, bn = (tid % 8) * 8;
#pragma unroll
  for (int j = 0; j < P; ++j) {
    uint2* da = reinterpret_cast<uint2*>(&b.a[ar][akk + 32 * j]);
    da[0] = make_uint2(p.a[j].x, p.a[j].y);
    da[1] = make_uint2(p.a[j].z, p.a[j].w);
    const uint32_t v[4] = {p.b[j].x, p.b[j].y, p.b[j].z, p.b[j].w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {  // column bn + 2 i is the low half of v[i], bn + 2 i + 1 the high half
      b.bt[bn + 2 * i][bkk + 32 * j] = static_cast<uint16_t>(v[i]);
      b.bt[bn + 2 * i + 1][bkk + 32 * j] = static_cast<uint16_t>(v[i] >> 16);
    }
  }
}

// acc[f] += the wave's 16 rows x the 16 columns of fragment f, over the step's TK channels.
template <typename T, int TK>
__device__ __forceinline__ void mfma_multiply(const MfmaTile<TK>& b, int wave, int lr, int lq,
                                              mfma_float4 (&acc)[4]) {
#pragma unroll
  for (int ks = 0; ks < TK; ks += 16) {
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

// The body for one K step shape and one kind of load (Vec: 16-byte vectors), so that the loop holds only those.
template <typename T, typename Shape, bool Vec>
__device__ __forceinline__ void forward_mfma_loop(const FwdArgs& a, TileState& st, MfmaShared& sm) {
  constexpr int TK = Shape::kK, S = Shape::kStages;
  const int wave = threadIdx.x / 64, lane = threadIdx.x % 64, lr = lane % 16, lq = lane / 16;
  const int cin = static_cast<int>(a.cin);
  const unsigned int mask = tile_prologue(a, st);
  typename Shape::Tile* tile;
  if constexpr (TK == 32)
    tile = sm.shallow;
  else
    tile = sm.deep;
  mfma_float4 acc[4];
  for (int f = 0; f < 4; ++f) acc[f] = mfma_float4{0.f, 0.f, 0.f, 0.f};
  MfmaIssuer is;
  mfma_issuer_init(a, st, mask, is);
  if (is.off.k < a.k1) {  // (the same in every thread, as every count and branch below)
    MfmaPieces<Shape::kPieces> p;
    mfma_fetch<Vec>(a, is, p);
    mfma_stash(p, tile[0]);
    mfma_next_channels<TK>(a, is);
    __syncthreads();
    int b = 0;
    for (;;) {
      if (is.c0 >= cin) {  // on to the next active offset (or none)
        walk_next(a, mask, is.off);
        mfma_at_offset(a, is);
        if (is.off.k >= a.k1) break;
      }
      // The steps whose loads stay in this offset: each fetches the next step before multiplying this one.
      for (const int end = cin; is.c0 < end;) {
        mfma_fetch<Vec>(a, is, p);
        mfma_next_channels<TK>(a, is);
        mfma_multiply<T>(tile[b], wave, lr, lq, acc);
        if (S == 1) __syncthreads();  // one buffer: every wave has read it
        b = S == 1 ? 0 : b ^ 1;
        mfma_stash(p, tile[b]);  // two buffers: last read one step ago, before the barrier that ended that step
        __syncthreads();
      }
    }
    mfma_multiply<T>(tile[b], wave, lr, lq, acc);  // the last step
    __syncthreads();  // every wave is done with the buffers the epilogue's tile overlaps
  }
  mfma_store(acc, sm.c, wave, lr, lq);
  store_tile<T>(a, st, &sm.c[0][0], BN + 4);
}

template <typename T, bool Vec>
__device__ __forceinline__ void forward_mfma_shape(const FwdArgs& a, TileState& st, MfmaShared& sm) {
  if (mfma_deep_k(static_cast<int>(a.cin)))
    forward_mfma_loop<T, MfmaDeep, Vec>(a, st, sm);
  else
    forward_mfma_loop<T, MfmaShallow, Vec>(a, st, sm);
}

template <typename T>
__device__ void forward_mfma(const FwdArgs& a) {
  __shared__ TileState st;
  __shared__ MfmaShared sm;
  if (a.vec)
    forward_mfma_shape<T, true>(a, st, sm);
  else
    forward_mfma_shape<T, false>(a, st, sm);
}
