// The grouped convolution (grouped_conv.h): the portable loops, the choice of body per shape and CPU (the AVX2
// and AVX-512 bodies: grouped_conv_avx2.cpp, grouped_conv_avx512.cpp), the bucketed forward's blocks, and the
// filter gradient by offset.
#include "grouped_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <type_traits>
#include <utility>
#include <vector>

#include "fused_gemm.h"
#include "gather_rows.h"
#include "grouped_conv_rows.h"
#include "one_thread_gemm.h"
#include "partial_sums.h"
#include "prefetch_rows.h"
#include "run_tasks.h"
#include "simd.h"
#include "split_k.h"

namespace spconv {
namespace native {

namespace {

using namespace grouped;

// Destination rows per parallel task of the forward: fixed, and each row is independent of the others.
constexpr int64_t kRowGrain = 128;
// Depthwise outputs of at least this many bytes are stored past the cache.
constexpr int64_t kStreamOutputBytes = int64_t{32} << 20;

// Backward: fixed blocks of input rows, each with its own dW partial (summed in block order). The block count
// depends on the sizes only (never on the thread count) and is bounded by the partials' memory.
constexpr int64_t kMinBlockRows = 1024, kMaxBlocks = 64, kPartialBudget = int64_t{16} << 20;
// Beyond this many bytes of dW, a rank-1 update per pair streams the partial through the cache: dW goes by
// per-offset GEMMs instead.
constexpr int64_t kSinglePassPartialBytes = int64_t{256} << 10;
// Groups of at least this many input and output channels go the two-pass way too: dX through the grouped
// forward's kernels and dW through the fused (or vendor) GEMMs beat the single pass's per-pair loop (and lose to
// it below 8).
constexpr int64_t kTwoPassGroupChannels = 8;

// The table rows [r0, r1) bucketed by offset: for each offset k in turn, its valid entries in row order (src
// the entry, dst the row), start[k] where they begin (start has kvol + 1 entries). Branch-free, as
// compact_rows_base; dst and src hold (r1 - r0) * kvol + 16 entries. False when an entry lies outside
// [-1, n_other).
bool compact_columns_base(const GroupedRows& s, int64_t r0, int64_t r1, int64_t* start, int32_t* dst, int32_t* src) {
  const int64_t kvol = s.kvol;
  bool bad = false;
  int64_t n = 0;
  for (int64_t k = 0; k < kvol; ++k) {
    start[k] = n;
    const int32_t* col = s.table + r0 * kvol + k;
    for (int64_t r = r0; r < r1; ++r, col += kvol) {
      const int32_t v = *col;
      const bool ok = v >= 0 && v < s.n_other;
      bad |= !ok && v != -1;
      dst[n] = static_cast<int32_t>(r);
      src[n] = v;
      n += ok;
    }
  }
  start[kvol] = n;
  return !bad;
}

// ---------------------------------------------------------------------------------------------------------
// Portable loops (double; float on CPUs without AVX2/FMA, and shapes the vector loops don't take).

template <typename T>
bool forward_rows_base(const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, T* y) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  return walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
    T* yr = y + r * cout;
    std::fill(yr, yr + cout, T(0));
    for (int64_t j = 0; j < l.n; ++j) {
      const T* xo = x + int64_t{l.other[j]} * cin;
      const T* wk = w + int64_t{l.offset[j]} * wk_size;
      if (cig == 1 && cog == 1) {  // depthwise: one product per channel
        for (int64_t c = 0; c < cout; ++c) yr[c] += xo[c] * wk[c];
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        T* yg = yr + g * cog;
        for (int64_t c = 0; c < cig; ++c) {
          const T xv = xo[g * cig + c];
          const T* wr = wk + (g * cig + c) * cog;
          for (int64_t t = 0; t < cog; ++t) yg[t] += xv * wr[t];
        }
      }
    }
  });
}

// Input rows [i0, i1): dx rows and their pairs' share of dW into part [kvol, G, cig, cog] (zero on entry).
template <typename T>
bool backward_rows_base(const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                        const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  return walk_rows(s, i0, i1, [&](int64_t i, const PairList& l) {
    const T* xi = x + i * cin;
    T* dxi = dx + i * cin;
    std::fill(dxi, dxi + cin, T(0));
    for (int64_t j = 0; j < l.n; ++j) {
      const T* d = dy + int64_t{l.other[j]} * cout;
      const T* wk = wt + int64_t{l.offset[j]} * wk_size;
      T* pk = part + int64_t{l.offset[j]} * wk_size;
      if (cig == 1 && cog == 1) {
        for (int64_t c = 0; c < cin; ++c) {
          dxi[c] += d[c] * wk[c];
          pk[c] += xi[c] * d[c];
        }
        continue;
      }
      for (int64_t g = 0; g < G; ++g) {
        const T* dg = d + g * cog;
        T* dxg = dxi + g * cig;
        for (int64_t t = 0; t < cog; ++t) {  // dx_g += dy_g @ W^T, W^T rows contiguous
          const T dv = dg[t];
          const T* wr = wk + (g * cog + t) * cig;
          for (int64_t c = 0; c < cig; ++c) dxg[c] += dv * wr[c];
        }
        for (int64_t c = 0; c < cig; ++c) {  // dW_g += x_g^T dy_g
          const T xv = xi[g * cig + c];
          T* pr = pk + (g * cig + c) * cog;
          for (int64_t t = 0; t < cog; ++t) pr[t] += xv * dg[t];
        }
      }
    }
  });
}

bool avx2_float(const at::Tensor& t) { return t.scalar_type() == at::kFloat && cpu_has_avx2_fma(); }

// A depthwise output (y, or dx) much larger than the cache is written once and read by the next layer from
// memory anyway: streamed past the cache it is not read in first (a third of the layer's memory traffic).
// The vector loops stream whole tiles (128 channels on AVX-512, 64 on AVX2) of 64-byte aligned rows.
bool streams_depthwise_output(int64_t G, int64_t cig, int64_t cog, const at::Tensor& out) {
  return cig == 1 && cog == 1 && G % 128 == 0 && out.scalar_type() == at::kFloat &&
         out.nbytes() >= static_cast<size_t>(kStreamOutputBytes) &&
         reinterpret_cast<uintptr_t>(out.const_data_ptr()) % 64 == 0;
}

template <typename T>
bool forward_rows(bool avx2, const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                  int64_t r0, int64_t r1, T* y, bool stream) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    const bool depthwise = cig == 1 && cog == 1;
    if (avx2 && cpu_has_avx512f() && (depthwise || cog % 16 == 0))
      return forward_rows_avx512(x, w, G, cig, cog, s, r0, r1, y, stream);
    if (avx2 && (depthwise || cog % 8 == 0)) return forward_rows_avx2(x, w, G, cig, cog, s, r0, r1, y, stream);
  }
#endif
  (void)avx2;
  (void)stream;
  return forward_rows_base(x, w, G, cig, cog, s, r0, r1, y);
}

template <typename T>
bool backward_rows(bool avx2, const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                   const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part, bool stream) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    if (avx2 && cig == 1 && cog == 1 && cpu_has_avx512f())
      return depthwise_backward_rows_avx512(x, wt, dy, G, s, i0, i1, dx, part, stream);
    if (avx2 && cig == 1 && cog == 1) return depthwise_backward_rows_avx2(x, wt, dy, G, s, i0, i1, dx, part, stream);
  }
#endif
  (void)avx2;
  (void)stream;
  return backward_rows_base(x, wt, dy, G, cig, cog, s, i0, i1, dx, part);
}

// ---------------------------------------------------------------------------------------------------------
// dW of general groups: a rank-1 update of a cig x cog block per pair would read and write the partial once per
// pair; grouping the pairs by offset turns it into GEMMs (X_g^T dY_g over gathered rows) that keep the block in
// registers. Segments of an offset's pairs (fixed by the sizes) sum into partials of their own, added in order.

// The pairs of rows [r0, r1) of s grouped by offset, each offset's in row order: offset k's are [start[k],
// start[k + 1]) of row (the walked side) and other. cur: scratch of kvol entries. False when a table entry is out
// of range (skipped).
bool bucket_by_offset(const GroupedRows& s, int64_t r0, int64_t r1, std::vector<int64_t>& start,
                      std::vector<int64_t>& cur, std::vector<int32_t>& row, std::vector<int32_t>& other) {
  start.assign(s.kvol + 1, 0);
  const bool ok = walk_rows(s, r0, r1, [&](int64_t, const PairList& l) {
    for (int64_t j = 0; j < l.n; ++j) ++start[l.offset[j] + 1];
  });
  for (int64_t k = 0; k < s.kvol; ++k) start[k + 1] += start[k];
  cur.assign(start.begin(), start.end() - 1);
  row.resize(start[s.kvol]);
  other.resize(start[s.kvol]);
  walk_rows(s, r0, r1, [&](int64_t r, const PairList& l) {
    for (int64_t j = 0; j < l.n; ++j) {
      const int64_t slot = cur[l.offset[j]]++;
      row[slot] = static_cast<int32_t>(r);
      other[slot] = l.other[j];
    }
  });
  return ok;
}

struct PairsByOffset {
  std::vector<int64_t> start;  // [kvol + 1]
  std::vector<int32_t> in, out;
};

// The pairs of `rows` (rows = inputs) grouped by offset, each offset's in input-row order.
bool pairs_by_offset(const GroupedRows& s, PairsByOffset& p) {
  std::vector<int64_t> cur;
  return bucket_by_offset(s, 0, s.rows, p.start, cur, p.in, p.out);
}

// Pairs per chunk of the grouped dW: every group takes the chunk in turn.
constexpr int64_t kGroupWeightGradChunk = 256;

// dw [kvol, G, cig, cog] = per offset and group, sum over the offset's pairs of x[in]_g^T dy[out]_g, split-K over
// the pairs (split_k.h). FP32/FP64 with a fused dW kernel for a group's channels (AVX-512: cog a multiple of the
// vector; AVX2: float, cog a multiple of 8 up to 64): each group's slice of the pairs' rows straight into the
// multiply, no gather buffers. Otherwise gathered chunks through the vendor GEMM.
void weight_grad_gemm(const at::Tensor& x, const at::Tensor& dy, const PairsByOffset& p, at::Tensor& dw) {
  const int64_t kvol = dw.size(0), G = dw.size(1), cig = dw.size(2), cog = dw.size(3);
  const int64_t cin = x.size(1), cout = dy.size(1);
  const bool fused = x.scalar_type() == at::kFloat    ? fused_weight_grad_ok<float>(cig, cog)
                     : x.scalar_type() == at::kDouble ? fused_weight_grad_ok<double>(cig, cog)
                                                      : false;
  const SplitK plan = plan_split_k(p.start.data(), kvol, cin, cout, x.element_size(), dw);
  const std::vector<KSegment>& segs = plan.segs;
  const int64_t rows = plan.rows;
  at::Tensor part = at::empty({plan.n_partials, G, cig, cog}, x.options());
  PartialsCountdown sums(plan, kvol);
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_weight_grad", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, double>) {
      if (fused) {
        run_tasks(static_cast<int64_t>(segs.size()), [&] {
          return [&](int64_t t) {
            const KSegment& sg = segs[t];
            scalar_t* acc = (sg.slot < 0 ? dw[sg.k] : part[sg.slot]).mutable_data_ptr<scalar_t>();
            // Chunks of pairs, every group in turn: the chunk's rows stay in L2 for the groups after the first.
            for (int64_t c0 = sg.begin; c0 < sg.end; c0 += kGroupWeightGradChunk)
              for (int64_t g = 0; g < G; ++g)
                fused_weight_grad(xp + g * cig, cin, cig, gp + g * cog, cout, cog, p.in.data() + c0,
                                  p.out.data() + c0, std::min(kGroupWeightGradChunk, sg.end - c0), c0 > sg.begin,
                                  acc + g * cig * cog);
            sums.segment_done(sg, part.const_data_ptr<scalar_t>(), dw.mutable_data_ptr<scalar_t>(), G * cig * cog);
          };
        });
        return;
      }
    }
    run_tasks<OneThreadGemm>(static_cast<int64_t>(segs.size()), [&] {
      at::Tensor a = at::empty({rows, cin}, x.options()), b = at::empty({rows, cout}, x.options());
      return [&, a, b](int64_t t) {
        const KSegment& sg = segs[t];
        at::Tensor acc = sg.slot < 0 ? dw[sg.k] : part[sg.slot];
        for (int64_t c0 = sg.begin; c0 < sg.end; c0 += rows) {
          const int64_t m = std::min(rows, sg.end - c0);
          gather_rows(xp, cin, p.in.data() + c0, m, a.mutable_data_ptr<scalar_t>());
          gather_rows(gp, cout, p.out.data() + c0, m, b.mutable_data_ptr<scalar_t>());
          for (int64_t g = 0; g < G; ++g) {
            at::Tensor lhs = a.narrow(0, 0, m).narrow(1, g * cig, cig).t(), rhs = b.narrow(0, 0, m).narrow(1, g * cog, cog);
            at::Tensor out = acc[g];
            if (c0 == sg.begin) at::mm_out(out, lhs, rhs);
            else out.addmm_(lhs, rhs);
          }
        }
        sums.segment_done(sg, part.const_data_ptr<scalar_t>(), dw.mutable_data_ptr<scalar_t>(), G * cig * cog);
      };
    });
  });
}

// ---------------------------------------------------------------------------------------------------------
// Forward of groups with many channels per group (float, AVX-512 or AVX2). A row-by-row loop loads the filter
// slice of each (pair, group) once per pair: loads, not FMAs, bound it. Here the pairs of a fixed block of
// destination rows are bucketed by offset, and 4-12 pairs of one offset share each filter load: every pair's
// product is summed in registers (input channels in order) and then added to its row, offsets in order. The
// blocks depend on the sizes only, and each row is written by its block alone: the bits don't depend on the
// thread count.
#if SPCONV_HAVE_AVX2_PATH
// Rows per block: the block's gathered input rows stay in L2 across its offsets (AVX2 128, AVX-512 256: the
// fastest of 64-1024, docs/routes.md, "Measured choices of the CPU kernels").
constexpr int64_t kBucketBlockRows = 128, kBucketBlockRows512 = 256;

// y[dst[p]] += x[src[p]]_g @ w_g for the pairs [0, m) of one offset and `groups` consecutive groups (filters wg,
// cig * cog apart), every column of each group; `ahead`: the block's pairs from this offset on (Lookahead).
using GroupPairs = void (*)(const float*, int64_t, const float*, int64_t, int64_t, int64_t, const int32_t*,
                            const int32_t*, int64_t, int64_t, int64_t, float*);

// avx512: the AVX-512 tiles, block size and table compaction; else the AVX2 ones.
bool forward_bucketed(bool avx512, const float* x, const float* w, int64_t G, int64_t cig, int64_t cog,
                      const GroupedRows& s, float* y) {
  const int64_t cin = G * cig, cout = G * cog, kvol = s.kvol;
  const GroupPairs pairs = avx512 ? group_pairs512 : group_pairs256;
  const int64_t block_rows = avx512 ? kBucketBlockRows512 : kBucketBlockRows;
  const int64_t n_blocks = (s.rows + block_rows - 1) / block_rows;
  std::atomic<bool> ok{true};
  run_tasks(n_blocks, [&] {
    return [&, start = std::vector<int64_t>(kvol + 1), cur = std::vector<int64_t>(kvol), dst = std::vector<int32_t>(),
            src = std::vector<int32_t>()](int64_t b) mutable {
      const int64_t r0 = b * block_rows, r1 = std::min(s.rows, r0 + block_rows);
      if (s.table != nullptr) {
        // The block's table column by column (its rows stay in L1); entries outside [-1, n_other) are
        // skipped and flagged.
        dst.resize((r1 - r0) * kvol + 16);
        src.resize((r1 - r0) * kvol + 16);
        // The block's table rows are contiguous: requested line by line first, so that the column walk's
        // strided reads find them in cache.
        for (const int32_t* t = s.table + r0 * kvol, *e = s.table + r1 * kvol; t < e; t += 64 / sizeof(int32_t))
          __builtin_prefetch(t, 0, 3);
        const bool valid = avx512 ? compact_columns_avx512(s, r0, r1, start.data(), dst.data(), src.data())
                                  : compact_columns_base(s, r0, r1, start.data(), dst.data(), src.data());
        if (!valid) ok = false;
      } else {
        bucket_by_offset(s, r0, r1, start, cur, dst, src);
      }
      // The source rows of the first tiles; the tiles request the rest as they go (Lookahead).
      prefetch_rows(x, cin, src.data(), std::min<int64_t>(start[kvol], kLookaheadTiles * 8));
      std::fill(y + r0 * cout, y + r1 * cout, 0.f);
      for (int64_t k = 0; k < kvol; ++k) {
        const int64_t m = start[k + 1] - start[k];
        if (m == 0) continue;
        pairs(x, cin, w + k * G * cig * cog, cig, cog, G, src.data() + start[k], dst.data() + start[k], m,
              start[kvol] - start[k], cout, y);
      }
    };
  });
  return ok;
}
#endif  // SPCONV_HAVE_AVX2_PATH

}  // namespace

bool grouped_forward(const at::Tensor& x, const at::Tensor& w, const GroupedRows& rows, at::Tensor& y) {
  const int64_t G = w.size(1), cig = w.size(2), cog = w.size(3);
  if (rows.rows == 0 || y.numel() == 0) return true;
#if SPCONV_HAVE_AVX2_PATH
  // Many channels per group: filter loads shared by several pairs (forward_bucketed) beat the row loop.
  if (avx2_float(x)) {
    const bool avx512 = cpu_has_avx512f();
    if (avx512 ? cig >= 16 && cog % 16 == 0 : cig >= 8 && cog % 8 == 0)
      return forward_bucketed(avx512, x.const_data_ptr<float>(), w.const_data_ptr<float>(), G, cig, cog, rows,
                              y.mutable_data_ptr<float>());
  }
#endif
  const bool avx2 = avx2_float(x);
  const bool stream = streams_depthwise_output(G, cig, cog, y);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    run_tasks((rows.rows + kRowGrain - 1) / kRowGrain, [&] {
      return [&](int64_t t) {
        const int64_t r0 = t * kRowGrain, r1 = std::min(rows.rows, r0 + kRowGrain);
        if (!forward_rows(avx2, xp, wp, G, cig, cog, rows, r0, r1, yp, stream)) ok = false;
      };
    });
  });
  return ok;
}

bool grouped_backward(const at::Tensor& x, const at::Tensor& wt, const at::Tensor& dy, const GroupedRows& rows,
                      at::Tensor& dx, at::Tensor& dw) {
  const int64_t kvol = wt.size(0), G = wt.size(1), cog = wt.size(2), cig = wt.size(3), n_in = rows.rows;
  const int64_t slice = kvol * G * cig * cog;
  if (n_in == 0 || slice == 0) {
    dx.zero_();
    dw.zero_();
    return true;
  }
  if (slice * x.element_size() > kSinglePassPartialBytes || std::min(cig, cog) >= kTwoPassGroupChannels) {
    // dX is the forward of dY over the reversed map with each group's filter transposed; dW goes by offset.
    const bool ok = grouped_forward(dy, wt, rows, dx);
    PairsByOffset p;
    const bool ok_pairs = pairs_by_offset(rows, p);
    weight_grad_gemm(x, dy, p, dw);
    return ok && ok_pairs;
  }
  // Small filters (depthwise, few channels per group): one pass, each pair's dY row read once for dX and dW,
  // the block's dW partial staying in cache.
  const int64_t by_memory = std::max<int64_t>(1, kPartialBudget / (slice * x.element_size()));
  const int64_t n_blocks = std::clamp<int64_t>((n_in + kMinBlockRows - 1) / kMinBlockRows, 1,
                                               std::min(kMaxBlocks, by_memory));
  const int64_t block = (n_in + n_blocks - 1) / n_blocks;
  at::Tensor part = at::empty({n_blocks, slice}, x.options());
  const bool avx2 = avx2_float(x);
  const bool stream = streams_depthwise_output(G, cig, cog, dx);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = wt.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    scalar_t* pp = part.mutable_data_ptr<scalar_t>();
    run_tasks(n_blocks, [&] {
      return [&](int64_t b) {
        scalar_t* pb = pp + b * slice;
        std::fill(pb, pb + slice, scalar_t(0));  // here, so each block's partial is first touched in its task
        const int64_t i0 = b * block, i1 = std::min(n_in, i0 + block);
        if (i0 < i1 && !backward_rows(avx2, xp, wp, gp, G, cig, cog, rows, i0, i1, dxp, pb, stream)) ok = false;
      };
    });
  });
  // The partials in block order: a fixed order, so the bits don't depend on the thread count.
  dw.copy_(sum_partials_in_order(part).view(dw.sizes()));
  return ok;
}

}  // namespace native
}  // namespace spconv
