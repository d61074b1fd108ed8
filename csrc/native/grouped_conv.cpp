#include "grouped_conv.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <vector>

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

namespace {

// Destination rows per parallel task of the forward: fixed, and each row is independent of the others.
constexpr int64_t kRowGrain = 128;
// Output columns accumulated in registers at a time (8 AVX vectors).
constexpr int64_t kColTile = 64;
// Rows ahead whose gathered source rows are prefetched: the gather order is data-dependent, so the hardware
// prefetcher can't follow it, and a depthwise row has too little arithmetic to hide the misses.
constexpr int64_t kPrefetchAhead = 4;
// Backward: fixed blocks of input rows, each with its own dW partial (summed in block order). The block count
// depends on the sizes only (never on the thread count) and is bounded by the partials' memory.
constexpr int64_t kMinBlockRows = 1024, kMaxBlocks = 64, kPartialBudget = int64_t{16} << 20;

// One destination row's pairs, from either source, in offset order. get() skips (and remembers) table entries
// outside [-1, n_other): a bad table raises instead of reading out of bounds.
struct RowPairs {
  const int32_t* table = nullptr;
  const int32_t* other = nullptr;
  const int32_t* offset = nullptr;
  int64_t n = 0, n_other = 0;
  bool bad = false;

  RowPairs(const GroupedRows& s, int64_t r) : n_other(s.n_other) {
    if (s.table != nullptr) {
      table = s.table + r * s.kvol;
      n = s.kvol;
    } else {
      other = s.other + s.start[r];
      offset = s.offset + s.start[r];
      n = s.start[r + 1] - s.start[r];
    }
  }
  // Pair j: its other row and offset; false when there is none.
  inline bool get(int64_t j, int64_t& o, int64_t& k) {
    if (table == nullptr) {
      o = other[j];
      k = offset[j];
      return true;
    }
    o = table[j];
    k = j;
    if (o >= 0 && o < n_other) return true;
    bad |= o != -1;
    return false;
  }
};

template <typename T>
inline void prefetch_sources(const GroupedRows& s, int64_t r, const T* src, int64_t c) {
  if (r >= s.rows) return;
  RowPairs rp(s, r);
  for (int64_t j = 0; j < rp.n; ++j) {
    int64_t o, k;
    if (!rp.get(j, o, k)) continue;
    const char* p = reinterpret_cast<const char*>(src + o * c);
    for (int64_t b = 0; b < c * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(p + b, 0, 3);
  }
}

// ---------------------------------------------------------------------------------------------------------
// Portable loops (double; float on CPUs without AVX2/FMA, and shapes the vector loops don't take).

template <typename T>
bool forward_rows_base(const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, T* y) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  bool ok = true;
  for (int64_t r = r0; r < r1; ++r) {
    prefetch_sources(s, r + kPrefetchAhead, x, cin);
    T* yr = y + r * cout;
    std::fill(yr, yr + cout, T(0));
    RowPairs rp(s, r);
    for (int64_t j = 0; j < rp.n; ++j) {
      int64_t o, k;
      if (!rp.get(j, o, k)) continue;
      const T* xo = x + o * cin;
      const T* wk = w + k * wk_size;
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
    ok &= !rp.bad;
  }
  return ok;
}

// Input rows [i0, i1): dx rows and their pairs' share of dW into part [kvol, G, cig, cog] (zero on entry).
template <typename T>
bool backward_rows_base(const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                        const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part) {
  const int64_t cin = G * cig, cout = G * cog, wk_size = G * cig * cog;
  bool ok = true;
  for (int64_t i = i0; i < i1; ++i) {
    prefetch_sources(s, i + kPrefetchAhead, dy, cout);
    const T* xi = x + i * cin;
    T* dxi = dx + i * cin;
    std::fill(dxi, dxi + cin, T(0));
    RowPairs rp(s, i);
    for (int64_t j = 0; j < rp.n; ++j) {
      int64_t o, k;
      if (!rp.get(j, o, k)) continue;
      const T* d = dy + o * cout;
      const T* wk = wt + k * wk_size;
      T* pk = part + k * wk_size;
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
    ok &= !rp.bad;
  }
  return ok;
}

// ---------------------------------------------------------------------------------------------------------
// AVX2/FMA loops for float: whole-vector loads, the last vector of a row masked.

#if SPCONV_HAVE_AVX2_PATH
SPCONV_TARGET_AVX2 inline __m256i tail_mask(int64_t lanes) {  // the first `lanes` (0-8) lanes set
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

SPCONV_TARGET_AVX2 inline __m256 load_n(const float* p, int64_t lanes) {
  return lanes >= 8 ? _mm256_loadu_ps(p) : _mm256_maskload_ps(p, tail_mask(lanes));
}

SPCONV_TARGET_AVX2 inline void store_n(float* p, __m256 v, int64_t lanes) {
  if (lanes >= 8) _mm256_storeu_ps(p, v);
  else _mm256_maskstore_ps(p, tail_mask(lanes), v);
}

// Depthwise forward, columns [c0, c0 + n) of row r (n <= 8 * NV).
template <int NV>
SPCONV_TARGET_AVX2 bool depthwise_tile(const float* x, const float* w, int64_t C, const GroupedRows& s, int64_t r,
                                       int64_t c0, int64_t n, float* y) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  RowPairs rp(s, r);
  for (int64_t j = 0; j < rp.n; ++j) {
    int64_t o, k;
    if (!rp.get(j, o, k)) continue;
    const float* xo = x + o * C + c0;
    const float* wk = w + k * C + c0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v)
      acc[v] = _mm256_fmadd_ps(load_n(xo + 8 * v, n - 8 * v), load_n(wk + 8 * v, n - 8 * v), acc[v]);
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) store_n(y + r * C + c0 + 8 * v, acc[v], n - 8 * v);
  return !rp.bad;
}

// Grouped forward, group g, columns [t0, t0 + 8 * NV) of the group's cog (a multiple of 8), row r.
template <int NV>
SPCONV_TARGET_AVX2 bool group_tile(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog,
                                   const GroupedRows& s, int64_t r, int64_t g, int64_t t0, float* y) {
  __m256 acc[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) acc[v] = _mm256_setzero_ps();
  const int64_t cin = G * cig;
  RowPairs rp(s, r);
  for (int64_t j = 0; j < rp.n; ++j) {
    int64_t o, k;
    if (!rp.get(j, o, k)) continue;
    const float* xo = x + o * cin + g * cig;
    const float* wg = w + ((k * G + g) * cig) * cog + t0;
    for (int64_t c = 0; c < cig; ++c) {
      const __m256 xb = _mm256_broadcast_ss(xo + c);
#pragma GCC unroll 8
      for (int v = 0; v < NV; ++v) acc[v] = _mm256_fmadd_ps(xb, _mm256_loadu_ps(wg + c * cog + 8 * v), acc[v]);
    }
  }
  float* yr = y + r * G * cog + g * cog + t0;
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) _mm256_storeu_ps(yr + 8 * v, acc[v]);
  return !rp.bad;
}

using DepthwiseTile = bool (*)(const float*, const float*, int64_t, const GroupedRows&, int64_t, int64_t, int64_t,
                               float*);
constexpr DepthwiseTile kDepthwiseTiles[] = {depthwise_tile<1>, depthwise_tile<2>, depthwise_tile<3>,
                                             depthwise_tile<4>, depthwise_tile<5>, depthwise_tile<6>,
                                             depthwise_tile<7>, depthwise_tile<8>};
using GroupTile = bool (*)(const float*, const float*, int64_t, int64_t, int64_t, const GroupedRows&, int64_t,
                           int64_t, int64_t, float*);
constexpr GroupTile kGroupTiles[] = {group_tile<1>, group_tile<2>, group_tile<3>, group_tile<4>,
                                     group_tile<5>, group_tile<6>, group_tile<7>, group_tile<8>};

bool forward_rows_avx2(const float* x, const float* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                       int64_t r0, int64_t r1, float* y) {
  bool ok = true;
  if (cig == 1 && cog == 1) {
    const int64_t C = G;
    for (int64_t r = r0; r < r1; ++r) {
      prefetch_sources(s, r + kPrefetchAhead, x, C);
      for (int64_t c0 = 0; c0 < C; c0 += kColTile) {
        const int64_t n = std::min(kColTile, C - c0);
        ok &= kDepthwiseTiles[(n + 7) / 8 - 1](x, w, C, s, r, c0, n, y);
      }
    }
    return ok;
  }
  for (int64_t r = r0; r < r1; ++r) {
    prefetch_sources(s, r + kPrefetchAhead, x, G * cig);
    for (int64_t g = 0; g < G; ++g)
      for (int64_t t0 = 0; t0 < cog; t0 += kColTile) {
        const int64_t n = std::min(kColTile, cog - t0);
        ok &= kGroupTiles[n / 8 - 1](x, w, G, cig, cog, s, r, g, t0, y);
      }
  }
  return ok;
}

// Depthwise backward over input rows [i0, i1), columns [c0, c0 + n): dx from registers, dW partial updated
// in place (it stays in L1: kvol x C floats).
template <int NV>
SPCONV_TARGET_AVX2 bool depthwise_backward_tile(const float* x, const float* w, const float* dy, int64_t C,
                                                const GroupedRows& s, int64_t i, int64_t c0, int64_t n, float* dx,
                                                float* part) {
  __m256 acc[NV], xi[NV];
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) {
    acc[v] = _mm256_setzero_ps();
    xi[v] = load_n(x + i * C + c0 + 8 * v, n - 8 * v);
  }
  RowPairs rp(s, i);
  for (int64_t j = 0; j < rp.n; ++j) {
    int64_t o, k;
    if (!rp.get(j, o, k)) continue;
    const float* d = dy + o * C + c0;
    const float* wk = w + k * C + c0;
    float* pk = part + k * C + c0;
#pragma GCC unroll 8
    for (int v = 0; v < NV; ++v) {
      const int64_t lanes = n - 8 * v;
      const __m256 dv = load_n(d + 8 * v, lanes);
      acc[v] = _mm256_fmadd_ps(dv, load_n(wk + 8 * v, lanes), acc[v]);
      store_n(pk + 8 * v, _mm256_fmadd_ps(xi[v], dv, load_n(pk + 8 * v, lanes)), lanes);
    }
  }
#pragma GCC unroll 8
  for (int v = 0; v < NV; ++v) store_n(dx + i * C + c0 + 8 * v, acc[v], n - 8 * v);
  return !rp.bad;
}

using DepthwiseBackwardTile = bool (*)(const float*, const float*, const float*, int64_t, const GroupedRows&,
                                       int64_t, int64_t, int64_t, float*, float*);
constexpr DepthwiseBackwardTile kDepthwiseBackwardTiles[] = {
    depthwise_backward_tile<1>, depthwise_backward_tile<2>, depthwise_backward_tile<3>, depthwise_backward_tile<4>,
    depthwise_backward_tile<5>, depthwise_backward_tile<6>, depthwise_backward_tile<7>, depthwise_backward_tile<8>};

bool depthwise_backward_rows_avx2(const float* x, const float* w, const float* dy, int64_t C, const GroupedRows& s,
                                  int64_t i0, int64_t i1, float* dx, float* part) {
  bool ok = true;
  for (int64_t i = i0; i < i1; ++i) {
    prefetch_sources(s, i + kPrefetchAhead, dy, C);
    for (int64_t c0 = 0; c0 < C; c0 += kColTile) {
      const int64_t n = std::min(kColTile, C - c0);
      ok &= kDepthwiseBackwardTiles[(n + 7) / 8 - 1](x, w, dy, C, s, i, c0, n, dx, part);
    }
  }
  return ok;
}
#endif  // SPCONV_HAVE_AVX2_PATH

bool avx2_float(const at::Tensor& t) { return t.scalar_type() == at::kFloat && cpu_has_avx2_fma(); }

template <typename T>
bool forward_rows(bool avx2, const T* x, const T* w, int64_t G, int64_t cig, int64_t cog, const GroupedRows& s,
                  int64_t r0, int64_t r1, T* y) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    if (avx2 && ((cig == 1 && cog == 1) || cog % 8 == 0)) return forward_rows_avx2(x, w, G, cig, cog, s, r0, r1, y);
  }
#endif
  (void)avx2;
  return forward_rows_base(x, w, G, cig, cog, s, r0, r1, y);
}

template <typename T>
bool backward_rows(bool avx2, const T* x, const T* wt, const T* dy, int64_t G, int64_t cig, int64_t cog,
                   const GroupedRows& s, int64_t i0, int64_t i1, T* dx, T* part) {
#if SPCONV_HAVE_AVX2_PATH
  if constexpr (std::is_same_v<T, float>) {
    if (avx2 && cig == 1 && cog == 1) return depthwise_backward_rows_avx2(x, wt, dy, G, s, i0, i1, dx, part);
  }
#endif
  (void)avx2;
  return backward_rows_base(x, wt, dy, G, cig, cog, s, i0, i1, dx, part);
}

}  // namespace

bool grouped_forward(const at::Tensor& x, const at::Tensor& w, const GroupedRows& rows, at::Tensor& y) {
  const int64_t G = w.size(1), cig = w.size(2), cog = w.size(3);
  if (rows.rows == 0 || y.numel() == 0) return true;
  const bool avx2 = avx2_float(x);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_forward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = w.const_data_ptr<scalar_t>();
    scalar_t* yp = y.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, rows.rows, kRowGrain, [&](int64_t r0, int64_t r1) {
      if (!forward_rows(avx2, xp, wp, G, cig, cog, rows, r0, r1, yp)) ok = false;
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
  const int64_t by_memory = std::max<int64_t>(1, kPartialBudget / (slice * x.element_size()));
  const int64_t n_blocks = std::clamp<int64_t>((n_in + kMinBlockRows - 1) / kMinBlockRows, 1,
                                               std::min(kMaxBlocks, by_memory));
  const int64_t block = (n_in + n_blocks - 1) / n_blocks;
  at::Tensor part = at::empty({n_blocks, slice}, x.options());
  const bool avx2 = avx2_float(x);
  std::atomic<bool> ok{true};
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "grouped_backward", [&] {
    const scalar_t* xp = x.const_data_ptr<scalar_t>();
    const scalar_t* wp = wt.const_data_ptr<scalar_t>();
    const scalar_t* gp = dy.const_data_ptr<scalar_t>();
    scalar_t* dxp = dx.mutable_data_ptr<scalar_t>();
    scalar_t* pp = part.mutable_data_ptr<scalar_t>();
    at::parallel_for(0, n_blocks, 1, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        scalar_t* pb = pp + b * slice;
        std::fill(pb, pb + slice, scalar_t(0));  // here, so each block's partial is first touched in its task
        const int64_t i0 = b * block, i1 = std::min(n_in, i0 + block);
        if (i0 < i1 && !backward_rows(avx2, xp, wp, gp, G, cig, cog, rows, i0, i1, dxp, pb)) ok = false;
      }
    });
  });
  // The partials in block order: a fixed order, so the bits don't depend on the thread count.
  at::Tensor total = part[0].clone();
  for (int64_t b = 1; b < n_blocks; ++b) total.add_(part[b]);
  dw.copy_(total.view(dw.sizes()));
  return ok;
}

}  // namespace native
}  // namespace spconv
