#include "gather_gemm_scatter.h"

#include "direct_conv.h"
#include "fused_gemm.h"
#include "gather_rows.h"
#include "one_thread_gemm.h"
#include "partial_sums.h"
#include "row_blocks.h"
#include "run_tasks.h"
#include "split_k.h"
#include "weight_layout.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdlib>
#include <string>
#include <atomic>
#include <cstring>
#include <functional>
#include <numeric>
#include <type_traits>
#include <vector>

namespace spconv {
namespace native {

namespace {

// The fused kernels for a tensor's dtype (float and double; the others take the vendor GEMM).
bool fused_gemm_ok_for(at::ScalarType t, int64_t cin, int64_t cout) {
  return t == at::kFloat ? fused_gemm_ok<float>(cin, cout) : t == at::kDouble && fused_gemm_ok<double>(cin, cout);
}

bool fused_weight_grad_ok_for(at::ScalarType t, int64_t cin, int64_t cout) {
  return t == at::kFloat ? fused_weight_grad_ok<float>(cin, cout)
                         : t == at::kDouble && fused_weight_grad_ok<double>(cin, cout);
}

bool fused_cpu_gemm_enabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPCONV_FUSED_CPU_GEMM");
    return v == nullptr || std::string(v) != "0";
  }();
  return on;
}

// Rows per GEMM chunk: keep the gathered block in L2, whatever the thread count.
int64_t chunk_rows(int64_t channels) { return std::clamp<int64_t>((int64_t{1} << 16) / std::max<int64_t>(channels, 1), 64, 1024); }

// True when offset k maps row p to row p for every row (the centre of a submanifold kernel).
bool is_identity(const int32_t* gather, const int32_t* scatter, int64_t count, int64_t n_src, int64_t n_dst) {
  if (count != n_src || count != n_dst) return false;
  bool ok = true;
  for (int64_t p = 0; p < count && ok; ++p) ok = gather[p] == p && scatter[p] == p;
  return ok;
}

// Rows per block of destination rows: a block's rows (with the GEMM buffers) stay in L2 across the offsets,
// and inputs split into blocks to run in parallel: at least min_blocks, and at least 16 where they keep 512 rows,
// else 8 (smaller blocks cost more than the balance gains: a stride-2 layer's 3.5k outputs).
int64_t cache_block_rows(int64_t n_rows, int64_t channels, int64_t elem_size, int64_t min_blocks = 0) {
  constexpr int64_t kBlockBytes = 512 * 1024, kMinBlocks = 8, kMinBlocksWide = 16, kWideBlockRows = 512;
  const int64_t many = std::max(kMinBlocksWide, min_blocks), few = std::max(kMinBlocks, min_blocks);
  const int64_t fits = kBlockBytes / std::max<int64_t>(channels * elem_size, 1);
  const int64_t wide = (n_rows + many - 1) / many;
  const int64_t split = wide >= kWideBlockRows ? wide : (n_rows + few - 1) / few;
  return std::max<int64_t>(64, std::min(fits, split));
}

// Blocks of the forward pass: at least 4 per thread, so that its dynamic schedule's last task is a small part of
// a thread's share on any core count. The blocks never change the forward's bits: a row is summed by one task,
// offset by offset, its pairs of an offset in their order whichever block holds them. (The backward's blocks
// also group the filter gradient's partial sums: they depend on the sizes only.)
int64_t forward_min_blocks() { return 4 * static_cast<int64_t>(at::get_num_threads()); }

// Task order, most pairs first.
std::vector<int64_t> longest_first(const std::vector<int64_t>& work) {
  std::vector<int64_t> order(work.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return work[a] > work[b]; });
  return order;
}

// W[k]^T for every offset: [kvol, c_out, c_in] row-major, from weights [kvol, c_in, c_out].
at::Tensor transposed_filters(const at::Tensor& weights) {
  const at::Tensor w = weights.contiguous();
  at::Tensor t = at::empty({w.size(0), w.size(2), w.size(1)}, w.options());
  transpose_matrices(w.const_data_ptr(), w.size(0), w.size(1), w.size(2), t.mutable_data_ptr(), w.element_size());
  return t;
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

namespace {

using TaskFn = std::function<void(int64_t)>;

// The one pass of gather_gemm_scatter, planned: a task per block of destination rows, through all offsets in
// order (a block's rows stay in cache, and no barrier separates the offsets). Tasks run in any order on any
// thread: each writes its own rows only.
class ForwardBlocks {
 public:
  ForwardBlocks(const at::Tensor& src, const at::Tensor& weights, bool transpose_w, const int32_t* gather,
                const int32_t* scatter, const int64_t* offsets, at::Tensor& dst, bool mirrored)
      : src_(src), dst_(dst), gather_(gather), scatter_(scatter), offsets_(offsets), kvol_(weights.size(0)),
        c_src_(src.size(1)), c_dst_(dst.size(1)), n_dst_(dst.size(0)), rows_(chunk_rows(std::max(c_src_, c_dst_))),
        identity_(identity_offsets(gather, scatter, offsets, kvol_, src.size(0), n_dst_)),
        blocks_(bucket_by_row_block(scatter, gather, offsets, kvol_, identity_, n_dst_,
                                    cache_block_rows(n_dst_, c_dst_, src.element_size(), forward_min_blocks()),
                                    mirrored)),
        // FP32 on AVX-512 / AVX2, FP64 on AVX-512: gather, product and scatter in one pass
        // (SPCONV_FUSED_CPU_GEMM=0: the vendor GEMM).
        fused_(fused_cpu_gemm_enabled() && fused_gemm_ok_for(src.scalar_type(), c_src_, c_dst_)) {
    w_.resize(kvol_);
    for (int64_t k = 0; k < kvol_; ++k) w_[k] = transpose_w ? weights[k].t() : weights[k];
    // Pair density varies a lot across a scan's rows: hand the blocks out by their pair counts.
    std::vector<int64_t> work(blocks_.n_blocks);
    for (int64_t b = 0; b < blocks_.n_blocks; ++b) work[b] = blocks_.pairs(b);
    order_ = longest_first(work);
    // W[k] as [c_src, c_dst] row-major: the weights themselves for the forward, transposed once for dinput.
    if (fused_) w_rows_ = transpose_w ? transposed_filters(weights) : weights.contiguous();
  }

  int64_t tasks() const { return blocks_.n_blocks; }

  // One per thread: the vendor-GEMM path's gather and product buffers live in it.
  TaskFn worker() const {
    return AT_DISPATCH_FLOATING_TYPES(src_.scalar_type(), "gather_gemm_scatter", [&]() -> TaskFn {
      return typed_worker<scalar_t>();
    });
  }

 private:
  template <typename T>
  TaskFn typed_worker() const {
    at::Tensor a = fused_ ? at::Tensor() : at::empty({rows_, c_src_}, src_.options());
    at::Tensor out = fused_ ? at::Tensor() : at::empty({rows_, c_dst_}, src_.options());
    return [this, a, out](int64_t t) {
      const T* x = src_.const_data_ptr<T>();
      T* y = dst_.mutable_data_ptr<T>();
      const int64_t b = order_[t];
      const int64_t r0 = b * blocks_.rows, r1 = std::min(n_dst_, r0 + blocks_.rows);
      std::fill(y + r0 * c_dst_, y + r1 * c_dst_, T(0));
      for (int64_t k = 0; k < kvol_; ++k) {
        if (identity_[k] && !fused_) {  // rows map to themselves: accumulate straight into the block
          dst_.narrow(0, r0, r1 - r0).addmm_(src_.narrow(0, r0, r1 - r0), w_[k]);
          continue;
        }
        // An identity offset's own pair lists are the block's rows in order (the fused kernel takes them).
        const int64_t begin = identity_[k] ? offsets_[k] + r0 : blocks_.begin(b, k);
        const int64_t count = identity_[k] ? r1 - r0 : blocks_.count(b, k);
        const int32_t* bkey = (identity_[k] ? scatter_ : blocks_.key(k)) + begin;
        const int32_t* bother = (identity_[k] ? gather_ : blocks_.other(k)) + begin;
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, double>) {
          if (fused_) {
            fused_gather_gemm_scatter(x, c_src_, bother, bkey, count, w_rows_.const_data_ptr<T>() + k * c_src_ * c_dst_,
                                      c_dst_, y);
            continue;
          }
        }
        for (int64_t c0 = 0; c0 < count; c0 += rows_) {
          const int64_t m = std::min(rows_, count - c0);
          gather_rows(x, c_src_, bother + c0, m, a.mutable_data_ptr<T>());
          at::Tensor o = out.narrow(0, 0, m);
          at::mm_out(o, a.narrow(0, 0, m), w_[k]);
          scatter_add_rows(o.const_data_ptr<T>(), c_dst_, bkey + c0, m, y);
        }
      }
    };
  }

  const at::Tensor& src_;
  at::Tensor& dst_;
  const int32_t* gather_;
  const int32_t* scatter_;
  const int64_t* offsets_;
  int64_t kvol_, c_src_, c_dst_, n_dst_, rows_;
  std::vector<char> identity_;
  RowBlocks blocks_;
  bool fused_;
  std::vector<at::Tensor> w_;
  std::vector<int64_t> order_;
  at::Tensor w_rows_;
};

// Runs planned passes (tasks() and worker()) as one set of tasks, in one parallel region: the passes' tasks
// are independent, and each region's barrier can wait on a descheduled thread.
template <typename... Passes>
void run_passes(const Passes&... passes) {
  const int64_t counts[] = {passes.tasks()...};
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  run_tasks<OneThreadGemm>(total, [&] {
    return [counts, workers = std::vector<TaskFn>{passes.worker()...}](int64_t t) {
      size_t i = 0;
      while (t >= counts[i]) t -= counts[i++];
      workers[i](t);
    };
  });
}

}  // namespace

void gather_gemm_scatter(const at::Tensor& src, const at::Tensor& weights, bool transpose_w,
                         const int32_t* gather, const int32_t* scatter, const int64_t* offsets, at::Tensor& dst,
                         bool mirrored) {
  if (!transpose_w && src.size(1) <= kDirectMaxInChannels) {
    direct_conv_forward(src, weights, gather, scatter, offsets, dst);
    return;
  }
  run_passes(ForwardBlocks(src, weights, transpose_w, gather, scatter, offsets, dst, mirrored));
}

namespace {

// dw[k] = sum_p x[pair_in[p]]^T dy[pair_out[p]], split over K (the pairs, split_k.h), planned: each task (a
// segment) sums its chunks' products (in pair order) into dw[k] or a partial of its own, and the last segment
// of an offset to finish adds its partials into dw[k] in order.
class WeightGradSegments {
 public:
  WeightGradSegments(const at::Tensor& x, const at::Tensor& dy, const int32_t* pair_in, const int32_t* pair_out,
                     const int64_t* offsets, const std::vector<char>& identity, at::Tensor& dw)
      : x_(x), dy_(dy), pair_in_(pair_in), pair_out_(pair_out), offsets_(offsets), identity_(identity), dw_(dw),
        c_in_(x.size(1)), c_out_(dy.size(1)),
        plan_(plan_split_k(offsets, dw.size(0), c_in_, c_out_, x.element_size(), dw)),
        part_(at::empty({plan_.n_partials, c_in_, c_out_}, x.options())), sums_(plan_, dw.size(0)),
        // FP32 and FP64 on AVX-512, FP32 with up to 64 output channels on AVX2: each segment in one pass over
        // its pairs, no gather buffers (SPCONV_FUSED_CPU_GEMM=0: the vendor GEMM).
        fused_(fused_cpu_gemm_enabled() && fused_weight_grad_ok_for(x.scalar_type(), c_in_, c_out_)) {
    std::vector<int64_t> work(plan_.segs.size());
    for (size_t i = 0; i < plan_.segs.size(); ++i) work[i] = plan_.segs[i].end - plan_.segs[i].begin;
    order_ = longest_first(work);
  }

  int64_t tasks() const { return static_cast<int64_t>(plan_.segs.size()); }

  TaskFn worker() const {
    return AT_DISPATCH_FLOATING_TYPES(x_.scalar_type(), "weight_grad", [&]() -> TaskFn {
      return typed_worker<scalar_t>();
    });
  }

 private:
  template <typename T>
  TaskFn typed_worker() const {
    const int64_t rows = plan_.rows;
    at::Tensor a = fused_ ? at::Tensor() : at::empty({rows, c_in_}, x_.options());
    at::Tensor b = fused_ ? at::Tensor() : at::empty({rows, c_out_}, x_.options());
    return [this, a, b, rows](int64_t t) {
      const T* xp = x_.const_data_ptr<T>();
      const T* gp = dy_.const_data_ptr<T>();
      const KSegment& sg = plan_.segs[order_[t]];
      at::Tensor acc = sg.slot < 0 ? dw_[sg.k] : part_[sg.slot];
      if (fused_) {
        fused_weight_grad(xp, c_in_, c_in_, gp, c_out_, c_out_, pair_in_ + sg.begin, pair_out_ + sg.begin,
                          sg.end - sg.begin, false, acc.mutable_data_ptr<T>());
      } else if (identity_[sg.k]) {  // rows map to themselves: no gather
        const int64_t r0 = sg.begin - offsets_[sg.k], n = sg.end - sg.begin;
        at::mm_out(acc, x_.narrow(0, r0, n).t(), dy_.narrow(0, r0, n));
      } else {
        for (int64_t c0 = sg.begin; c0 < sg.end; c0 += rows) {
          const int64_t m = std::min(rows, sg.end - c0);
          gather_rows(xp, c_in_, pair_in_ + c0, m, a.mutable_data_ptr<T>());
          gather_rows(gp, c_out_, pair_out_ + c0, m, b.mutable_data_ptr<T>());
          if (c0 == sg.begin) at::mm_out(acc, a.narrow(0, 0, m).t(), b.narrow(0, 0, m));
          else acc.addmm_(a.narrow(0, 0, m).t(), b.narrow(0, 0, m));
        }
      }
      sums_.segment_done(sg, part_.const_data_ptr<T>(), dw_.mutable_data_ptr<T>(), c_in_ * c_out_);
    };
  }

  const at::Tensor& x_;
  const at::Tensor& dy_;
  const int32_t* pair_in_;
  const int32_t* pair_out_;
  const int64_t* offsets_;
  const std::vector<char>& identity_;
  at::Tensor& dw_;
  int64_t c_in_, c_out_;
  SplitK plan_;
  at::Tensor part_;
  mutable PartialsCountdown sums_;  // the tasks' shared countdown (atomic)
  bool fused_;
  std::vector<int64_t> order_;
};

// The fused backward of row blocks [b0, b1) (backward_by_row_blocks): their dX rows, and their pairs' dW products
// summed into acc [kvol, c_in, c_out], offset by offset in block order. wt: W[k]^T as [kvol, c_out, c_in].
template <typename T>
void fused_backward_blocks(const T* x, int64_t c_in, const T* dy, int64_t c_out, const T* wt, const int32_t* pair_in,
                           const int32_t* pair_out, const int64_t* offsets, const std::vector<char>& identity,
                           const RowBlocks& blocks, int64_t n_in, int64_t b0, int64_t b1, T* dx, T* acc) {
  const int64_t kvol = blocks.kvol;
  std::vector<char> started(kvol, 0);
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t r0 = blk * blocks.rows, r1 = std::min(n_in, r0 + blocks.rows);
    std::fill(dx + r0 * c_in, dx + r1 * c_in, T(0));
    for (int64_t k = 0; k < kvol; ++k) {
      // An identity offset's own pair lists are the block's rows in order.
      const int32_t* in = identity[k] ? pair_in + offsets[k] + r0 : blocks.key(k) + blocks.begin(blk, k);
      const int32_t* out = identity[k] ? pair_out + offsets[k] + r0 : blocks.other(k) + blocks.begin(blk, k);
      const int64_t m = identity[k] ? r1 - r0 : blocks.count(blk, k);
      if (m == 0) continue;
      // dX rows += dY[out] W[k]^T, then dW[k] += X[in]^T dY[out]: the dY rows are read again while in cache.
      fused_gather_gemm_scatter(dy, c_out, out, in, m, wt + k * c_out * c_in, c_in, dx);
      fused_weight_grad(x, c_in, c_in, dy, c_out, c_out, in, out, m, started[k] != 0, acc + k * c_in * c_out);
      started[k] = 1;
    }
  }
  for (int64_t k = 0; k < kvol; ++k)
    if (!started[k]) std::fill(acc + k * c_in * c_out, acc + (k + 1) * c_in * c_out, T(0));
}

// Backward in one pass over blocks of input rows (a block's X and dX rows stay in cache across its offsets, and
// each dY row it reads serves both products while in cache). dW is split by runs of consecutive blocks
// ("groups") of about equal pair counts: each group sums its products into a partial of its own, then the
// partials are added in group order. Blocks and groups depend on the sizes only: the bits don't depend on the
// thread count. FP32/FP64 with the fused kernels for both products (dX as the forward of dY with W^T) read the
// rows straight into the multiply; otherwise the vendor GEMM runs on gathered chunks.
void backward_by_row_blocks(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                            const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets,
                            const std::vector<char>& identity, int64_t n_groups, bool fused_kernels, bool mirrored,
                            at::Tensor& dx, at::Tensor& dw) {
  const int64_t kvol = weights.size(0), c_in = x.size(1), c_out = dy.size(1), n_in = x.size(0);
  const int64_t rows = chunk_rows(std::max(c_in, c_out));
  std::vector<at::Tensor> wt(kvol);
  for (int64_t k = 0; k < kvol; ++k) wt[k] = weights[k].t();
  const RowBlocks blocks = bucket_by_row_block(pair_in, pair_out, offsets, kvol, identity, n_in,
                                               cache_block_rows(n_in, std::max(c_in, c_out), x.element_size()),
                                               mirrored);
  int64_t identity_rows = 0;
  for (int64_t k = 0; k < kvol; ++k) identity_rows += identity[k] ? 1 : 0;
  std::vector<int64_t> cum(blocks.n_blocks + 1, 0);  // pairs (identity rows included) before each block
  for (int64_t b = 0; b < blocks.n_blocks; ++b)
    cum[b + 1] = cum[b] + blocks.pairs(b) +
                 identity_rows * (std::min(n_in, (b + 1) * blocks.rows) - b * blocks.rows);
  n_groups = std::clamp<int64_t>(n_groups, 1, std::max<int64_t>(blocks.n_blocks, 1));
  std::vector<int64_t> first_block(n_groups + 1, blocks.n_blocks);  // group g: blocks [first_block[g], first_block[g+1])
  for (int64_t g = 0, b = 0; g < n_groups; ++g) {
    while (b < blocks.n_blocks && cum[b] * n_groups < cum.back() * g) ++b;
    first_block[g] = b;
  }
  std::vector<int64_t> work(n_groups);
  for (int64_t g = 0; g < n_groups; ++g) work[g] = cum[first_block[g + 1]] - cum[first_block[g]];
  const std::vector<int64_t> order = longest_first(work);
  // Group 0 sums straight into dw, the others into partials.
  at::Tensor part = at::empty({n_groups - 1, kvol, c_in, c_out}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "gather_gemm_scatter_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      if (fused_kernels) {
        // W[k]^T as [c_out, c_in] row-major for the dX kernel.
        const at::Tensor wt_rows = transposed_filters(weights);
        const scalar_t* wtp = wt_rows.const_data_ptr<scalar_t>();
        run_tasks(n_groups, [&] {
          return [&](int64_t t) {
            const int64_t g = order[t];
            fused_backward_blocks(xp, c_in, gp, c_out, wtp, pair_in, pair_out, offsets, identity, blocks, n_in,
                                  first_block[g], first_block[g + 1], dxp,
                                  (g == 0 ? dw : part[g - 1]).mutable_data_ptr<scalar_t>());
          };
        });
        return;
      }
    }
    run_tasks<OneThreadGemm>(n_groups, [&] {
      at::Tensor a = at::empty({rows, c_in}, x.options());
      at::Tensor b = at::empty({rows, c_out}, x.options());
      at::Tensor o = at::empty({rows, c_in}, x.options());
      return [&, a, b, o](int64_t t) {
        const int64_t g = order[t];
        at::Tensor acc_all = g == 0 ? dw : part[g - 1];
        std::vector<char> started(kvol, 0);
        // The first product of an offset overwrites its (uninitialised) partial, the others add to it.
        auto accumulate = [&](int64_t k, const at::Tensor& lhs, const at::Tensor& rhs) {
          at::Tensor acc = acc_all[k];
          if (started[k]) acc.addmm_(lhs, rhs);
          else at::mm_out(acc, lhs, rhs);
          started[k] = 1;
        };
        for (int64_t blk = first_block[g]; blk < first_block[g + 1]; ++blk) {
          const int64_t r0 = blk * blocks.rows, r1 = std::min(n_in, r0 + blocks.rows);
          std::fill(dxp + r0 * c_in, dxp + r1 * c_in, scalar_t(0));
          for (int64_t k = 0; k < kvol; ++k) {
            if (identity[k]) {  // rows map to themselves: no gather or scatter
              at::Tensor xs = x.narrow(0, r0, r1 - r0), gs = dy.narrow(0, r0, r1 - r0);
              dx.narrow(0, r0, r1 - r0).addmm_(gs, wt[k]);
              accumulate(k, xs.t(), gs);
              continue;
            }
            const int64_t begin = blocks.begin(blk, k), count = blocks.count(blk, k);
            for (int64_t c0 = 0; c0 < count; c0 += rows) {
              const int64_t m = std::min(rows, count - c0);
              const int32_t* pin = blocks.key(k) + begin + c0;
              // One gather of dY serves both dX (dY W^T, scattered to the inputs) and dW (X^T dY).
              gather_rows(gp, c_out, blocks.other(k) + begin + c0, m, b.mutable_data_ptr<scalar_t>());
              gather_rows(xp, c_in, pin, m, a.mutable_data_ptr<scalar_t>());
              at::Tensor bm = b.narrow(0, 0, m), om = o.narrow(0, 0, m);
              at::mm_out(om, bm, wt[k]);
              scatter_add_rows(om.const_data_ptr<scalar_t>(), c_in, pin, m, dxp);
              accumulate(k, a.narrow(0, 0, m).t(), bm);
            }
          }
        }
        for (int64_t k = 0; k < kvol; ++k)
          if (!started[k]) acc_all[k].zero_();
      };
    });
  });
  add_partials_in_order(part, dw);
}

}  // namespace

void gather_gemm_scatter_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                                  const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets,
                                  at::Tensor& dx, at::Tensor& dw, bool mirrored) {
  if (x.size(1) <= kDirectMaxInChannels) {
    direct_conv_backward(x, weights, dy, pair_in, pair_out, offsets, dx, dw);
    return;
  }
  const int64_t kvol = weights.size(0);
  const std::vector<char> identity = identity_offsets(pair_in, pair_out, offsets, kvol, x.size(0), dy.size(0));
  // One pass over blocks of input rows shares the dY gather between dX and dW and keeps X and dX rows in
  // cache: it wins on large inputs, as long as its per-group dW partials are many (for balance) and cheap
  // next to the work. Otherwise dX and dW go separately: no partials but the dW pass gathers again.
  constexpr int64_t kPartialBytes = int64_t{32} << 20, kMaxGroups = 16, kMinGroups = 12, kPairsPerPartialEntry = 256;
  const int64_t partial = kvol * x.size(1) * dy.size(1) * x.element_size();
  const int64_t groups = std::min(kMaxGroups, kPartialBytes / partial);
  const int64_t pairs = offsets[kvol] - offsets[0];
  // With the fused kernels for both products and X, dY small enough to stay in cache, the separate passes win
  // against the fused row blocks; larger inputs keep the row blocks' locality.
  constexpr int64_t kFusedBackwardBytes = int64_t{16} << 20;
  // Both products have a fused kernel (dX is the forward of dY with W^T, so its channels swap).
  const bool fused_kernels = fused_cpu_gemm_enabled() &&
                             fused_weight_grad_ok_for(x.scalar_type(), x.size(1), dy.size(1)) &&
                             fused_gemm_ok_for(x.scalar_type(), dy.size(1), x.size(1));
  const bool fused_separate =
      fused_kernels && (x.numel() + dy.numel()) * x.element_size() <= kFusedBackwardBytes;
  if (!fused_separate && groups >= kMinGroups && pairs >= kPairsPerPartialEntry * kvol * groups) {
    backward_by_row_blocks(x, weights, dy, pair_in, pair_out, offsets, identity, groups, fused_kernels, mirrored, dx,
                           dw);
    return;
  }
  // dX is the forward of dY with W^T over the reversed pairs (blocked by input rows); dW goes split-K over
  // the pairs, so neither limits the other's parallelism. Both in one region: dW's segments fill the end of
  // dX's blocks, and one barrier instead of two.
  run_passes(ForwardBlocks(dy, weights, /*transpose_w=*/true, pair_out, pair_in, offsets, dx, mirrored),
             WeightGradSegments(x, dy, pair_in, pair_out, offsets, identity, dw));
}

}  // namespace native
}  // namespace spconv
