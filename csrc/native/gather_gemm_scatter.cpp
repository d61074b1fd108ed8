#include "gather_gemm_scatter.h"

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

template <typename T>
void gather_rows(const T* src, int64_t c, const int32_t* idx, int64_t m, T* buf) {
  for (int64_t r = 0; r < m; ++r) std::memcpy(buf + r * c, src + static_cast<int64_t>(idx[r]) * c, sizeof(T) * c);
}

template <typename T>
void scatter_add_rows(const T* buf, int64_t c, const int32_t* idx, int64_t m, T* dst) {
  for (int64_t r = 0; r < m; ++r) {
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

void gathered_weight_grad(const at::Tensor& x, const at::Tensor& dy, const int32_t* pair_in,
                          const int32_t* pair_out, const int64_t* offsets, at::Tensor& dw) {
  const int64_t kvol = dw.size(0), c_in = x.size(1), c_out = dy.size(1);
  // Long chunks: the GEMM's inner dimension is the pair count.
  const int64_t rows = 4 * chunk_rows(std::max(c_in, c_out));
  // One partial product per (offset, chunk), then a fixed-order sum: reproducible bits.
  std::vector<int64_t> first_chunk(kvol + 1, 0);
  for (int64_t k = 0; k < kvol; ++k)
    first_chunk[k + 1] = first_chunk[k] + (offsets[k + 1] - offsets[k] + rows - 1) / rows;
  const int64_t total = first_chunk[kvol];
  at::Tensor partial = at::zeros({std::max<int64_t>(total, 1), c_in, c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gathered_weight_grad", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    at::parallel_for(0, total, 1, [&](int64_t t0, int64_t t1) {
      ChunkGuard guard;
      at::Tensor a = at::empty({rows, c_in}, x.options());
      at::Tensor b = at::empty({rows, c_out}, x.options());
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t k = std::upper_bound(first_chunk.begin(), first_chunk.end(), t) - first_chunk.begin() - 1;
        const int64_t r0 = offsets[k] + (t - first_chunk[k]) * rows;
        const int64_t m = std::min(rows, offsets[k + 1] - r0);
        gather_rows(xp, c_in, pair_in + r0, m, a.mutable_data_ptr<scalar_t>());
        gather_rows(gp, c_out, pair_out + r0, m, b.mutable_data_ptr<scalar_t>());
        at::Tensor p = partial[t];
        at::mm_out(p, a.narrow(0, 0, m).t(), b.narrow(0, 0, m));
      }
    });
  });
  at::parallel_for(0, kvol, 1, [&](int64_t k0, int64_t k1) {
    ChunkGuard guard;
    for (int64_t k = k0; k < k1; ++k) {
      at::Tensor acc = dw[k];
      acc.zero_();
      for (int64_t t = first_chunk[k]; t < first_chunk[k + 1]; ++t) acc.add_(partial[t]);
    }
  });
}

}  // namespace native
}  // namespace spconv
