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
  AT_DISPATCH_FLOATING_TYPES(src.scalar_type(), "gather_gemm_scatter", [&] {
    const scalar_t* x = src.const_data_ptr<scalar_t>();
    scalar_t* y = dst.mutable_data_ptr<scalar_t>();
    for (int64_t k = 0; k < kvol; ++k) {
      const int64_t begin = offsets[k], count = offsets[k + 1] - begin;
      if (count == 0) continue;
      at::Tensor w = transpose_w ? weights[k].t() : weights[k];
      const int32_t* g = gather + begin;
      const int32_t* s = scatter + begin;
      if (is_identity(g, s, count, src.size(0), dst.size(0))) {
        // No gather or scatter: accumulate straight into the output, chunk by chunk.
        const int64_t n_chunks = (count + rows - 1) / rows;
        at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
          ChunkGuard guard;
          for (int64_t c = c0; c < c1; ++c) {
            const int64_t r0 = c * rows, m = std::min(rows, count - r0);
            at::Tensor out = dst.narrow(0, r0, m);
            out.addmm_(src.narrow(0, r0, m), w);
          }
        });
        continue;
      }
      const int64_t n_chunks = (count + rows - 1) / rows;
      at::parallel_for(0, n_chunks, 1, [&](int64_t c0, int64_t c1) {
        ChunkGuard guard;
        at::Tensor a = at::empty({rows, c_src}, src.options());
        at::Tensor out = at::empty({rows, c_dst}, src.options());
        for (int64_t c = c0; c < c1; ++c) {
          const int64_t r0 = c * rows, m = std::min(rows, count - r0);
          gather_rows(x, c_src, g + r0, m, a.mutable_data_ptr<scalar_t>());
          at::Tensor o = out.narrow(0, 0, m);
          at::mm_out(o, a.narrow(0, 0, m), w);
          scatter_add_rows(o.const_data_ptr<scalar_t>(), c_dst, s + r0, m, y);
        }
      });
    }
  });
}

void gather_gemm_scatter_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                                  const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets,
                                  at::Tensor& dx, at::Tensor& dw) {
  if (x.size(1) <= kDirectMaxInChannels) {
    direct_conv_backward(x, weights, dy, pair_in, pair_out, offsets, dx, dw);
    return;
  }
  const int64_t kvol = weights.size(0), c_in = x.size(1), c_out = dy.size(1);
  const int64_t rows = chunk_rows(std::max(c_in, c_out));
  // dW[k] is summed over a fixed number of lanes (each a fixed run of chunks), then the lanes in order:
  // reproducible bits for any thread count, with parallelism up to kLanes threads per offset.
  constexpr int64_t kLanes = 16;
  at::Tensor lane_acc = at::empty({kLanes, c_in, c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gather_gemm_scatter_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    for (int64_t k = 0; k < kvol; ++k) {
      const int64_t begin = offsets[k], count = offsets[k + 1] - begin;
      at::Tensor dwk = dw[k];
      if (count == 0) {
        dwk.zero_();
        continue;
      }
      const at::Tensor wt = weights[k].t();
      const int32_t* pin = pair_in + begin;
      const int32_t* pout = pair_out + begin;
      const bool identity = is_identity(pin, pout, count, x.size(0), dy.size(0));
      const int64_t n_chunks = (count + rows - 1) / rows;
      const int64_t lanes = std::min(kLanes, n_chunks);
      lane_acc.narrow(0, 0, lanes).zero_();
      at::parallel_for(0, lanes, 1, [&](int64_t l0, int64_t l1) {
        ChunkGuard guard;
        at::Tensor a = at::empty({rows, c_in}, x.options());
        at::Tensor b = at::empty({rows, c_out}, x.options());
        at::Tensor o = at::empty({rows, c_in}, x.options());
        for (int64_t lane = l0; lane < l1; ++lane) {
          at::Tensor acc = lane_acc[lane];
          for (int64_t c = lane * n_chunks / lanes; c < (lane + 1) * n_chunks / lanes; ++c) {
            const int64_t r0 = c * rows, m = std::min(rows, count - r0);
            if (identity) {  // rows map to themselves: no gather or scatter
              at::Tensor xs = x.narrow(0, r0, m), gs = dy.narrow(0, r0, m);
              dx.narrow(0, r0, m).addmm_(gs, wt);
              acc.addmm_(xs.t(), gs);
              continue;
            }
            // One gather of dY serves both dX (dY W^T, scattered to the inputs) and dW (X^T dY).
            gather_rows(gp, c_out, pout + r0, m, b.mutable_data_ptr<scalar_t>());
            gather_rows(xp, c_in, pin + r0, m, a.mutable_data_ptr<scalar_t>());
            at::Tensor bm = b.narrow(0, 0, m), om = o.narrow(0, 0, m);
            at::mm_out(om, bm, wt);
            scatter_add_rows(om.const_data_ptr<scalar_t>(), c_in, pin + r0, m, dxp);
            acc.addmm_(a.narrow(0, 0, m).t(), bm);
          }
        }
      });
      dwk.copy_(lane_acc[0]);
      for (int64_t lane = 1; lane < lanes; ++lane) dwk.add_(lane_acc[lane]);
    }
  });
}

}  // namespace native
}  // namespace spconv
