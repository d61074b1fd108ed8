#include "direct_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <vector>

#include "lane_masks.h"
#include "pairs_by_row.h"
#include "partial_sums.h"
#include "run_tasks.h"
#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

namespace {

// Output rows per forward task: fixed, so the split never depends on the thread count.
constexpr int64_t kRowGrain = 256;
// Columns of one output row accumulated at a time (registers on the AVX2 path).
constexpr int64_t kColTile = 64;

// The backward walks input rows in fixed blocks, each with its own dW partial sum; the partials are then
// added in block order. At most kMaxDwBlocks blocks bound the partials' memory.
constexpr int64_t kMinBlockRows = 1024;
constexpr int64_t kMaxDwBlocks = 64;

// Forward tasks: kRowGrain output rows each.
int64_t row_tasks(int64_t n_out) { return (n_out + kRowGrain - 1) / kRowGrain; }
int64_t row_end(int64_t t, int64_t n_out) { return std::min(n_out, (t + 1) * kRowGrain); }

int64_t block_rows(int64_t n_in) {
  return std::max(kMinBlockRows, (n_in + kMaxDwBlocks - 1) / kMaxDwBlocks);
}

// ---------------------------------------------------------------------------------------------------------
// Portable loops: double, and float on CPUs without AVX2/FMA. Weights w are [kvol, cin, cout].

template <typename T>
void forward_rows_base(const T* x, int64_t cin, const T* w, int64_t cout, const PairsByRow& g, int64_t o0,
                       int64_t o1, T* y) {
  T acc[kColTile];
  for (int64_t o = o0; o < o1; ++o) {
    for (int64_t c0 = 0; c0 < cout; c0 += kColTile) {
      const int64_t n = std::min(kColTile, cout - c0);
      std::fill(acc, acc + n, T(0));
      for (int64_t j = g.start[o]; j < g.start[o + 1]; ++j) {
        const T* xi = x + int64_t{g.other[j]} * cin;
        const T* wk = w + int64_t{g.offset[j]} * cin * cout + c0;
        for (int64_t ci = 0; ci < cin; ++ci)
          for (int64_t t = 0; t < n; ++t) acc[t] += xi[ci] * wk[ci * cout + t];
      }
      std::copy(acc, acc + n, y + o * cout + c0);
    }
  }
}

// Input rows [i0, i1): dx rows, and their pairs' share of dW into part [kvol, cin, cout] (zero on entry).
template <typename T>
void backward_rows_base(const T* x, const T* dy, const T* w, int64_t cin, int64_t cout, const PairsByRow& g,
                        int64_t i0, int64_t i1, T* dx, T* part) {
  for (int64_t i = i0; i < i1; ++i) {
    const T* xi = x + i * cin;
    for (int64_t j = g.start[i]; j < g.start[i + 1]; ++j) {
      const T* go = dy + int64_t{g.other[j]} * cout;
      const int64_t k = g.offset[j];
      for (int64_t ci = 0; ci < cin; ++ci) {
        const T* wr = w + (k * cin + ci) * cout;
        T* pr = part + (k * cin + ci) * cout;
        T s = 0;
        for (int64_t co = 0; co < cout; ++co) s += go[co] * wr[co];
        dx[i * cin + ci] += s;
        for (int64_t co = 0; co < cout; ++co) pr[co] += xi[ci] * go[co];
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------------
// AVX2/FMA loops for float. Weights wp are [kvol, cin, cpad]: cout padded with zeros to a multiple of 8, so
// every weight load is a whole vector; loads of dy rows and stores of y rows mask their last vector.

#if SPCONV_HAVE_AVX2_PATH
SPCONV_TARGET_AVX2 inline float hsum(__m256 v) {  // a fixed reduction tree: same bits every time
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Columns [c0, c0 + n) of output row o (n <= 8 * NV), over its pairs, in NV vector registers.
template <int NV>
SPCONV_TARGET_AVX2 void forward_tile_avx2(const float* x, int64_t cin, const float* wp, int64_t cpad,
                                          const PairsByRow& g, int64_t o, int64_t c0, int64_t n, float* yrow) {
  __m256 acc[NV];  // fully unrolled loops over v keep these in registers
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  for (int64_t j = g.start[o]; j < g.start[o + 1]; ++j) {
    const float* xi = x + int64_t{g.other[j]} * cin;
    const float* wk = wp + int64_t{g.offset[j]} * cin * cpad + c0;
    for (int64_t ci = 0; ci < cin; ++ci) {
      const __m256 xb = _mm256_broadcast_ss(xi + ci);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wk + ci * cpad + 8 * v), acc[v]);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    if (8 * (v + 1) <= n) _mm256_storeu_ps(yrow + c0 + 8 * v, acc[v]);
    else _mm256_maskstore_ps(yrow + c0 + 8 * v, tail_mask(n - 8 * v), acc[v]);
  }
}

using ForwardTile = void (*)(const float*, int64_t, const float*, int64_t, const PairsByRow&, int64_t, int64_t,
                             int64_t, float*);
constexpr ForwardTile kForwardTiles[] = {forward_tile_avx2<1>, forward_tile_avx2<2>, forward_tile_avx2<3>,
                                         forward_tile_avx2<4>, forward_tile_avx2<5>, forward_tile_avx2<6>,
                                         forward_tile_avx2<7>, forward_tile_avx2<8>};
static_assert(sizeof(kForwardTiles) / sizeof(kForwardTiles[0]) * 8 == kColTile);

void forward_rows_avx2(const float* x, int64_t cin, const float* wp, int64_t cpad, int64_t cout,
                       const PairsByRow& g, int64_t o0, int64_t o1, float* y) {
  for (int64_t o = o0; o < o1; ++o)
    for (int64_t c0 = 0; c0 < cout; c0 += kColTile) {
      const int64_t n = std::min(kColTile, cout - c0);
      kForwardTiles[(n + 7) / 8 - 1](x, cin, wp, cpad, g, o, c0, n, y + o * cout);
    }
}

// Input rows [i0, i1) with CIN channels: dx row = sum over pairs of dy[o] W_k^T (CIN registers, reduced
// once per row), and part[k] += x[i]^T dy[o] from the same dy loads.
template <int CIN>
SPCONV_TARGET_AVX2 void backward_rows_avx2(const float* x, const float* dy, const float* wp, int64_t cout,
                                           int64_t cpad, const PairsByRow& g, int64_t i0, int64_t i1, float* dx,
                                           float* part) {
  const int64_t nv = cpad / 8, full = cout / 8;
  const __m256i last = tail_mask(cout - 8 * full);
  for (int64_t i = i0; i < i1; ++i) {
    __m256 acc[CIN], xb[CIN];  // fully unrolled loops over c keep these in registers
#pragma GCC unroll 8
    for (int c = 0; c < CIN; ++c) {
      acc[c] = _mm256_setzero_ps();
      xb[c] = _mm256_broadcast_ss(x + i * CIN + c);
    }
    for (int64_t j = g.start[i]; j < g.start[i + 1]; ++j) {
      const float* go = dy + int64_t{g.other[j]} * cout;
      const float* wk = wp + int64_t{g.offset[j]} * CIN * cpad;
      float* pk = part + int64_t{g.offset[j]} * CIN * cpad;
      for (int64_t v = 0; v < nv; ++v) {
        const __m256 d = v < full ? _mm256_loadu_ps(go + 8 * v) : _mm256_maskload_ps(go + 8 * v, last);
#pragma GCC unroll 8
        for (int c = 0; c < CIN; ++c) {
          acc[c] = _mm256_fmadd_ps(d, _mm256_loadu_ps(wk + c * cpad + 8 * v), acc[c]);
          float* p = pk + c * cpad + 8 * v;
          _mm256_storeu_ps(p, _mm256_fmadd_ps(xb[c], d, _mm256_loadu_ps(p)));
        }
      }
    }
#pragma GCC unroll 8
    for (int c = 0; c < CIN; ++c) dx[i * CIN + c] += hsum(acc[c]);
  }
}

using BackwardRows = void (*)(const float*, const float*, const float*, int64_t, int64_t, const PairsByRow&,
                              int64_t, int64_t, float*, float*);
constexpr BackwardRows kBackwardRows[] = {backward_rows_avx2<1>, backward_rows_avx2<2>, backward_rows_avx2<3>,
                                          backward_rows_avx2<4>, backward_rows_avx2<5>, backward_rows_avx2<6>,
                                          backward_rows_avx2<7>, backward_rows_avx2<8>};
static_assert(sizeof(kBackwardRows) / sizeof(kBackwardRows[0]) == kDirectMaxInChannels);
#endif  // SPCONV_HAVE_AVX2_PATH

// The backward over input rows [i0, i1): AVX2 for float when the CPU has it, else the portable loops.
template <typename T>
void backward_rows(bool, const T* x, const T* dy, const T* w, int64_t cin, int64_t cout, int64_t,
                   const PairsByRow& g, int64_t i0, int64_t i1, T* dx, T* part) {
  backward_rows_base(x, dy, w, cin, cout, g, i0, i1, dx, part);
}

void backward_rows(bool avx2, const float* x, const float* dy, const float* w, int64_t cin, int64_t cout,
                   int64_t cpad, const PairsByRow& g, int64_t i0, int64_t i1, float* dx, float* part) {
#if SPCONV_HAVE_AVX2_PATH
  if (avx2) return kBackwardRows[cin - 1](x, dy, w, cout, cpad, g, i0, i1, dx, part);
#endif
  backward_rows_base(x, dy, w, cin, cout, g, i0, i1, dx, part);
}

bool use_avx2(const at::Tensor& t) { return t.scalar_type() == at::kFloat && cpu_has_avx2_fma(); }

// Weights [kvol, cin, cout] -> [kvol, cin, cpad], zero-padded columns.
at::Tensor pad_columns(const at::Tensor& w, int64_t cpad) {
  const int64_t cout = w.size(2);
  if (cpad == cout) return w.contiguous();
  at::Tensor p = at::zeros({w.size(0), w.size(1), cpad}, w.options());
  p.narrow(2, 0, cout).copy_(w);
  return p;
}

int64_t round_up8(int64_t n) { return (n + 7) / 8 * 8; }

}  // namespace

void direct_conv_forward(const at::Tensor& x, const at::Tensor& weights, const int32_t* pair_in,
                         const int32_t* pair_out, const int64_t* offsets, at::Tensor& dst) {
  const int64_t kvol = weights.size(0), cin = x.size(1), cout = dst.size(1), n_out = dst.size(0);
  const PairsByRow g = group_pairs_by_row(pair_out, pair_in, offsets, kvol, n_out);
#if SPCONV_HAVE_AVX2_PATH
  if (use_avx2(x)) {
    const int64_t cpad = round_up8(cout);
    const at::Tensor wp = pad_columns(weights, cpad);
    const float* xp = x.const_data_ptr<float>();
    const float* wpp = wp.const_data_ptr<float>();
    float* y = dst.mutable_data_ptr<float>();
    run_tasks(row_tasks(n_out), [&] {
      return [&](int64_t t) { forward_rows_avx2(xp, cin, wpp, cpad, cout, g, t * kRowGrain, row_end(t, n_out), y); };
    });
    return;
  }
#endif
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "direct_conv_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = weights.const_data_ptr<scalar_t>();
    scalar_t* y = dst.mutable_data_ptr<scalar_t>();
    run_tasks(row_tasks(n_out), [&] {
      return [&](int64_t t) { forward_rows_base(xp, cin, wp, cout, g, t * kRowGrain, row_end(t, n_out), y); };
    });
  });
}

void direct_conv_backward(const at::Tensor& x, const at::Tensor& weights, const at::Tensor& dy,
                          const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, at::Tensor& dx,
                          at::Tensor& dw) {
  const int64_t kvol = weights.size(0), cin = x.size(1), cout = dy.size(1), n_in = x.size(0);
  const PairsByRow g = group_pairs_by_row(pair_in, pair_out, offsets, kvol, n_in);
  const bool avx2 = use_avx2(x);
  const int64_t cpad = avx2 ? round_up8(cout) : cout;
  const int64_t rows = block_rows(n_in), n_blocks = (n_in + rows - 1) / rows;
  // One dW partial per block of input rows, summed in block order below. Each task zeroes its own; with no
  // input rows the one partial is zeros.
  at::Tensor part = n_blocks > 0 ? at::empty({n_blocks, kvol, cin, cpad}, x.options())
                                 : at::zeros({1, kvol, cin, cpad}, x.options());
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "direct_conv_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    scalar_t* pp = part.mutable_data_ptr<scalar_t>();
    const at::Tensor wpad = pad_columns(weights, cpad);
    const scalar_t* wp = wpad.const_data_ptr<scalar_t>();
    // Blocks handed out one at a time: a thread the OS deschedules (a busy machine) leaves its blocks to the
    // others. Each block zeroes its own partial and dX rows, in its task.
    run_tasks(n_blocks, [&] {
      return [&](int64_t b) {
        const int64_t i0 = b * rows, i1 = std::min(n_in, i0 + rows);
        scalar_t* pb = pp + b * kvol * cin * cpad;
        std::fill(pb, pb + kvol * cin * cpad, scalar_t(0));
        std::fill(dxp + i0 * cin, dxp + i1 * cin, scalar_t(0));
        backward_rows(avx2, xp, gp, wp, cin, cout, cpad, g, i0, i1, dxp, pb);
      };
    });
  });
  // Block partials in order (a fixed order: the blocks don't depend on the thread count).
  dw.copy_(sum_partials_in_order(part).narrow(2, 0, cout));
}

}  // namespace native
}  // namespace spconv
