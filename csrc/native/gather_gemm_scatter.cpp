#include "gather_gemm_scatter.h"

#include "direct_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstring>
#include <vector>

namespace spconv {
namespace native {

namespace {

// MKL's GEMM splits small-M products differently with 1 or 2 threads (different bits). Parallelism
// here comes from the fixed chunks only: each GEMM runs on one thread, so results don't depend on
// torch.set_num_threads. Weak, so builds whose BLAS isn't MKL simply skip it. (The lowercase
// mkl_set_num_threads_local symbol is MKL's Fortran entry point, which takes a pointer.)
extern "C" int MKL_Set_Num_Threads_Local(int) __attribute__((weak));

struct ChunkGuard {
  // ATen calls on OpenMP worker threads don't inherit the caller's below-autograd dispatch state:
  // without this, mm_out on tensors that require grad throws there (only with > 1 thread).
  at::AutoDispatchBelowADInplaceOrView below_autograd;
  int saved = 0;
  ChunkGuard() {
    if (MKL_Set_Num_Threads_Local) saved = MKL_Set_Num_Threads_Local(1);
  }
  ~ChunkGuard() {
    if (MKL_Set_Num_Threads_Local) MKL_Set_Num_Threads_Local(saved);
  }
};

// Rows per GEMM chunk: keep the gathered block in L2, whatever the thread count.
int64_t chunk_rows(int64_t channels) { return std::clamp<int64_t>((int64_t{1} << 16) / std::max<int64_t>(channels, 1), 64, 1024); }

// Rows are fetched in a data-dependent order the hardware prefetcher can't follow: prefetch a few rows ahead.
constexpr int64_t kPrefetchRows = 8;

template <typename T>
void prefetch_row(const T* row, int64_t c, int write) {
  for (int64_t j = 0; j < c; j += 64 / static_cast<int64_t>(sizeof(T))) {
    if (write) __builtin_prefetch(row + j, 1);
    else __builtin_prefetch(row + j, 0);
  }
}

template <typename T>
void gather_rows(const T* src, int64_t c, const int32_t* idx, int64_t m, T* buf) {
  for (int64_t r = 0; r < m; ++r) {
    if (r + kPrefetchRows < m) prefetch_row(src + static_cast<int64_t>(idx[r + kPrefetchRows]) * c, c, 0);
    std::memcpy(buf + r * c, src + static_cast<int64_t>(idx[r]) * c, sizeof(T) * c);
  }
}

template <typename T>
void scatter_add_rows(const T* buf, int64_t c, const int32_t* idx, int64_t m, T* dst) {
  for (int64_t r = 0; r < m; ++r) {
    if (r + kPrefetchRows < m) prefetch_row(dst + static_cast<int64_t>(idx[r + kPrefetchRows]) * c, c, 1);
    T* d = dst + static_cast<int64_t>(idx[r]) * c;
    const T* s = buf + r * c;
    for (int64_t j = 0; j < c; ++j) d[j] += s[j];
  }
}

// True when offset k maps row p to row p for every row (the centre of a submanifold kernel).
bool is_identity(const int32_t* gather, const int32_t* scatter, int64_t count, int64_t n_src, int64_t n_dst) {
  if (count != n_src || count != n_dst) return false;
  bool ok = true;
  for (int64_t p = 0; p < count && ok; ++p) ok = gather[p] == p && scatter[p] == p;
  return ok;
}

// Rows per block of destination rows: a block's rows (with the GEMM buffers) stay in L2 across the offsets,
// and small inputs still split into a few blocks to run in parallel. Depends on the sizes only, never on the
// thread count.
int64_t cache_block_rows(int64_t n_rows, int64_t channels, int64_t elem_size) {
  constexpr int64_t kBlockBytes = 512 * 1024, kMinBlocks = 8;
  const int64_t fits = kBlockBytes / std::max<int64_t>(channels * elem_size, 1);
  return std::max<int64_t>(64, std::min(fits, (n_rows + kMinBlocks - 1) / kMinBlocks));
}

// The pairs bucketed by (block of key rows, offset): bucket b * kvol + k holds, in their original order, the
// pairs of offset k whose key row (the side written) lies in block b. Identity offsets are left out: they
// apply to each block's own rows directly.
struct RowBlocks {
  int64_t rows = 0, n_blocks = 0;
  std::vector<int64_t> start;  // [n_blocks * kvol + 1]
  std::vector<int32_t> key, other;

  int64_t begin(int64_t b, int64_t k, int64_t kvol) const { return start[b * kvol + k]; }
  int64_t count(int64_t b, int64_t k, int64_t kvol) const { return start[b * kvol + k + 1] - start[b * kvol + k]; }
};

RowBlocks bucket_by_row_block(const int32_t* key, const int32_t* other, const int64_t* offsets, int64_t kvol,
                              const std::vector<char>& identity, int64_t n_rows, int64_t block_rows) {
  RowBlocks d;
  d.rows = block_rows;
  d.n_blocks = (n_rows + block_rows - 1) / block_rows;
  d.start.assign(d.n_blocks * kvol + 1, 0);
  for (int64_t k = 0; k < kvol; ++k) {
    if (identity[k]) continue;
    for (int64_t p = offsets[k]; p < offsets[k + 1]; ++p) ++d.start[key[p] / block_rows * kvol + k + 1];
  }
  for (size_t i = 1; i < d.start.size(); ++i) d.start[i] += d.start[i - 1];
  std::vector<int64_t> cursor(d.start.begin(), d.start.end() - 1);
  d.key.resize(d.start.back());
  d.other.resize(d.start.back());
  for (int64_t k = 0; k < kvol; ++k) {
    if (identity[k]) continue;
    for (int64_t p = offsets[k]; p < offsets[k + 1]; ++p) {
      const int64_t slot = cursor[key[p] / block_rows * kvol + k]++;
      d.key[slot] = key[p];
      d.other[slot] = other[p];
    }
  }
  return d;
}

// Input rows per backward block. Every block holds a dW partial ([kvol, c_in, c_out]), so blocks are at
// least L2-sized and at most kMaxDwPartials (fewer when the partials would pass kPartialBytes).
int64_t backward_block_rows(int64_t n_in, int64_t kvol, int64_t c_in, int64_t c_out, int64_t elem_size) {
  constexpr int64_t kMaxDwPartials = 32, kPartialBytes = int64_t{32} << 20;
  const int64_t partial = std::max<int64_t>(kvol * c_in * c_out * elem_size, 1);
  const int64_t n_partials = std::clamp<int64_t>(kPartialBytes / partial, 1, kMaxDwPartials);
  return std::max(cache_block_rows(n_in, std::max(c_in, c_out), elem_size), (n_in + n_partials - 1) / n_partials);
}

// Which offsets are identities (the centre of a submanifold kernel).
std::vector<char> identity_offsets(const int32_t* gather, const int32_t* scatter, const int64_t* offsets,
                                   int64_t kvol, int64_t n_src, int64_t n_dst) {
  std::vector<char> identity(kvol);
  for (int64_t k = 0; k < kvol; ++k) {
    const int64_t count = offsets[k + 1] - offsets[k];
    identity[k] = count > 0 && is_identity(gather + offsets[k], scatter + offsets[k], count, n_src, n_dst);
  }
  return identity;
}

}  // namespace

void gather_gemm_scatter(const at::Tensor& src, const at::Tensor& weights, bool transpose_w,
                         const int32_t* gather, const int32_t* scatter, const int64_t* offsets, at::Tensor& dst) {
  if (!transpose_w && src.size(1) <= kDirectMaxInChannels) {
    direct_conv_forward(src, weights, gather, scatter, offsets, dst);
    return;
  }
  const int64_t kvol = weights.size(0);
  const int64_t c_src = src.size(1), c_dst = dst.size(1);
  const int64_t rows = chunk_rows(std::max(c_src, c_dst));
  const int64_t n_src = src.size(0), n_dst = dst.size(0);
  const std::vector<char> identity = identity_offsets(gather, scatter, offsets, kvol, n_src, n_dst);
  std::vector<at::Tensor> w(kvol);
  for (int64_t k = 0; k < kvol; ++k) w[k] = transpose_w ? weights[k].t() : weights[k];
  const RowBlocks blocks = bucket_by_row_block(scatter, gather, offsets, kvol, identity, n_dst,
                                               cache_block_rows(n_dst, c_dst, src.element_size()));
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "gather_gemm_scatter", [&] {
    const scalar_t* x = src.const_data_ptr<scalar_t>();
    scalar_t* y = dst.mutable_data_ptr<scalar_t>();
    // One parallel pass over the blocks: a block's rows stay in cache over all offsets, and no barrier
    // separates the offsets.
    at::parallel_for(0, blocks.n_blocks, 1, [&](int64_t b0, int64_t b1) {
      ChunkGuard guard;
      at::Tensor a = at::empty({rows, c_src}, src.options());
      at::Tensor out = at::empty({rows, c_dst}, src.options());
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t r0 = b * blocks.rows, r1 = std::min(n_dst, r0 + blocks.rows);
        for (int64_t k = 0; k < kvol; ++k) {
          if (identity[k]) {  // rows map to themselves: accumulate straight into the block
            dst.narrow(0, r0, r1 - r0).addmm_(src.narrow(0, r0, r1 - r0), w[k]);
            continue;
          }
          const int64_t begin = blocks.begin(b, k, kvol), count = blocks.count(b, k, kvol);
          for (int64_t c0 = 0; c0 < count; c0 += rows) {
            const int64_t m = std::min(rows, count - c0);
            gather_rows(x, c_src, blocks.other.data() + begin + c0, m, a.mutable_data_ptr<scalar_t>());
            at::Tensor o = out.narrow(0, 0, m);
            at::mm_out(o, a.narrow(0, 0, m), w[k]);
            scatter_add_rows(o.const_data_ptr<scalar_t>(), c_dst, blocks.key.data() + begin + c0, m, y);
          }
        }
      }
    });
  });
}

void gather_gemm_scatter_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                                  const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets,
                                  at::Tensor& dx, at::Tensor& dw) {
  if (x.size(1) <= kDirectMaxInChannels) {
    direct_conv_backward(x, weights, dy, pair_in, pair_out, offsets, dx, dw);
    return;
  }
  const int64_t kvol = weights.size(0), c_in = x.size(1), c_out = dy.size(1), n_in = x.size(0);
  const int64_t rows = chunk_rows(std::max(c_in, c_out));
  const std::vector<char> identity = identity_offsets(pair_in, pair_out, offsets, kvol, n_in, dy.size(0));
  std::vector<at::Tensor> wt(kvol);
  for (int64_t k = 0; k < kvol; ++k) wt[k] = weights[k].t();
  const RowBlocks blocks = bucket_by_row_block(pair_in, pair_out, offsets, kvol, identity, n_in,
                                               backward_block_rows(n_in, kvol, c_in, c_out, x.element_size()));
  // dW partial sums per block of input rows, added in block order below: reproducible bits for any thread count.
  at::Tensor part = at::zeros({std::max<int64_t>(blocks.n_blocks, 1), kvol, c_in, c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gather_gemm_scatter_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, blocks.n_blocks, 1, [&](int64_t b0, int64_t b1) {
      ChunkGuard guard;
      at::Tensor a = at::empty({rows, c_in}, x.options());
      at::Tensor b = at::empty({rows, c_out}, x.options());
      at::Tensor o = at::empty({rows, c_in}, x.options());
      for (int64_t blk = b0; blk < b1; ++blk) {
        const int64_t r0 = blk * blocks.rows, r1 = std::min(n_in, r0 + blocks.rows);
        for (int64_t k = 0; k < kvol; ++k) {
          at::Tensor acc = part[blk][k];
          if (identity[k]) {  // rows map to themselves: no gather or scatter
            at::Tensor xs = x.narrow(0, r0, r1 - r0), gs = dy.narrow(0, r0, r1 - r0);
            dx.narrow(0, r0, r1 - r0).addmm_(gs, wt[k]);
            acc.addmm_(xs.t(), gs);
            continue;
          }
          const int64_t begin = blocks.begin(blk, k, kvol), count = blocks.count(blk, k, kvol);
          for (int64_t c0 = 0; c0 < count; c0 += rows) {
            const int64_t m = std::min(rows, count - c0);
            const int32_t* pin = blocks.key.data() + begin + c0;
            // One gather of dY serves both dX (dY W^T, scattered to the inputs) and dW (X^T dY).
            gather_rows(gp, c_out, blocks.other.data() + begin + c0, m, b.mutable_data_ptr<scalar_t>());
            gather_rows(xp, c_in, pin, m, a.mutable_data_ptr<scalar_t>());
            at::Tensor bm = b.narrow(0, 0, m), om = o.narrow(0, 0, m);
            at::mm_out(om, bm, wt[k]);
            scatter_add_rows(om.const_data_ptr<scalar_t>(), c_in, pin, m, dxp);
            acc.addmm_(a.narrow(0, 0, m).t(), bm);
          }
        }
      }
    });
  });
  dw.copy_(part[0]);
  for (int64_t blk = 1; blk < blocks.n_blocks; ++blk) dw.add_(part[blk]);
}

}  // namespace native
}  // namespace spconv
