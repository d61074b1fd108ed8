#include "pool.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <memory>
#include <type_traits>
#include <vector>

#include "pairs_by_row.h"
#include "simd.h"

namespace spconv {
namespace native {

namespace {
// acc = src where src > acc or src is NaN: a NaN wins and sticks, as in dense max pooling. Written
// branch-free so the compiler vectorises it.
template <typename T>
inline __attribute__((always_inline)) void max_into(T* acc, const T* src, int64_t c) {
  for (int64_t j = 0; j < c; ++j) {
    const T s = src[j], a = acc[j];
    acc[j] = ((s > a) | (s != s)) ? s : a;
  }
}

// Rows [o0, o1) of the max pool, each from zero (spconv's max(0, window max)) over its pairs in offset order.
template <typename T>
inline __attribute__((always_inline)) void maxpool_rows(const T* x, int64_t c, const PairsByRow& g, int64_t o0,
                                                        int64_t o1, T* out) {
  for (int64_t o = o0; o < o1; ++o) {
    std::fill(out + o * c, out + (o + 1) * c, T(0));
    for (int64_t j = g.start[o]; j < g.start[o + 1]; ++j)
      max_into(out + o * c, x + static_cast<int64_t>(g.other[j]) * c, c);
  }
}

template <typename T>
SPCONV_TARGET_AVX2 void maxpool_rows_avx2(const T* x, int64_t c, const PairsByRow& g, int64_t o0, int64_t o1,
                                          T* out) {
  maxpool_rows(x, c, g, o0, o1, out);
}

template <typename T>
void maxpool_rows_base(const T* x, int64_t c, const PairsByRow& g, int64_t o0, int64_t o1, T* out) {
  maxpool_rows(x, c, g, o0, o1, out);
}

// Output rows per task: fixed, so the work split doesn't depend on the thread count (results don't either:
// every output row is computed by one task).
int64_t row_grain(int64_t channels) { return std::max<int64_t>(16, 8192 / std::max<int64_t>(channels, 1)); }

// Max pool gradient routing. win[c] holds the kernel offset whose input took the gradient of channel c
// (kNoWinner while none has): the first offset, in order, whose input equals the output.
template <typename T>
using WinTag = std::conditional_t<sizeof(T) == 4, int32_t, int64_t>;  // same lane width as T: vectorises
constexpr int kNoWinner = -1;

template <typename T, typename Tag>
inline __attribute__((always_inline)) void claim(Tag* win, const T* xi, const T* yo, Tag k, int64_t c) {
  for (int64_t j = 0; j < c; ++j) {
    const T xv = xi[j], yv = yo[j];
    const bool is_max = (xv == yv) | ((xv != xv) & (yv != yv));  // a NaN max is its first NaN
    win[j] = ((win[j] == kNoWinner) & is_max) ? k : win[j];
  }
}

template <typename T, typename Tag>
inline __attribute__((always_inline)) void route(T* gi, const T* go, const Tag* win, Tag k, int64_t c) {
  // Adding 0 where the gradient isn't routed keeps gi exactly (gi starts at +0 and a sum is never -0),
  // and unlike a conditional store it vectorises.
  for (int64_t j = 0; j < c; ++j) {
    const T g = go[j];
    gi[j] += win[j] == k ? g : T(0);
  }
}

// Claims for output rows [o0, o1) into win [num_out, C]; with route_now (every input in at most one pair,
// so no two outputs write the same din row) the gradients are routed at once and win is one scratch row.
template <typename T>
inline __attribute__((always_inline)) void maxpool_backward_rows(const T* x, const T* out, const T* dout, int64_t c,
                                                                 const PairsByRow& g, int64_t o0, int64_t o1,
                                                                 bool route_now, WinTag<T>* win, T* din) {
  using Tag = WinTag<T>;
  for (int64_t o = o0; o < o1; ++o) {
    Tag* w = route_now ? win : win + o * c;
    std::fill(w, w + c, Tag{kNoWinner});
    for (int64_t j = g.start[o]; j < g.start[o + 1]; ++j) {
      const int64_t i = g.other[j];
      const Tag k = g.offset[j];
      claim(w, x + i * c, out + o * c, k, c);
      if (route_now) route(din + i * c, dout + o * c, w, k, c);
    }
  }
}

template <typename T>
SPCONV_TARGET_AVX2 void maxpool_backward_rows_avx2(const T* x, const T* out, const T* dout, int64_t c,
                                                   const PairsByRow& g, int64_t o0, int64_t o1, bool route_now,
                                                   WinTag<T>* win, T* din) {
  maxpool_backward_rows(x, out, dout, c, g, o0, o1, route_now, win, din);
}

template <typename T>
void maxpool_backward_rows_base(const T* x, const T* out, const T* dout, int64_t c, const PairsByRow& g,
                                int64_t o0, int64_t o1, bool route_now, WinTag<T>* win, T* din) {
  maxpool_backward_rows(x, out, dout, c, g, o0, o1, route_now, win, din);
}

// Routes the claimed gradients to input rows [i0, i1), each over its pairs in offset order (the order in
// which an input shared by several outputs sums their gradients).
template <typename T>
inline __attribute__((always_inline)) void route_rows(const T* dout, int64_t c, const WinTag<T>* win,
                                                      const PairsByRow& by_in, int64_t i0, int64_t i1, T* din) {
  for (int64_t i = i0; i < i1; ++i)
    for (int64_t j = by_in.start[i]; j < by_in.start[i + 1]; ++j) {
      const int64_t o = by_in.other[j];
      route(din + i * c, dout + o * c, win + o * c, WinTag<T>(by_in.offset[j]), c);
    }
}

template <typename T>
SPCONV_TARGET_AVX2 void route_rows_avx2(const T* dout, int64_t c, const WinTag<T>* win, const PairsByRow& by_in,
                                        int64_t i0, int64_t i1, T* din) {
  route_rows(dout, c, win, by_in, i0, i1, din);
}

template <typename T>
void route_rows_base(const T* dout, int64_t c, const WinTag<T>* win, const PairsByRow& by_in, int64_t i0,
                     int64_t i1, T* din) {
  route_rows(dout, c, win, by_in, i0, i1, din);
}
}  // namespace

template <typename T>
void maxpool_forward(const T* x, int64_t channels, int64_t num_out, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* out) {
  const PairsByRow g = group_pairs_by_row(pair_out, pair_in, offsets, kvol, num_out);
  const bool avx2 = cpu_has_avx2_fma();
  at::parallel_for(0, num_out, row_grain(channels), [&](int64_t o0, int64_t o1) {
    if (avx2) maxpool_rows_avx2(x, channels, g, o0, o1, out);
    else maxpool_rows_base(x, channels, g, o0, o1, out);
  });
}

template <typename T>
void maxpool_backward(const T* x, const T* out, const T* dout, int64_t channels, int64_t num_in, int64_t num_out,
                      const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, int64_t kvol,
                      T* din) {
  using Tag = WinTag<T>;
  const int64_t n = offsets[kvol];
  const PairsByRow g = group_pairs_by_row(pair_out, pair_in, offsets, kvol, num_out);
  const bool avx2 = cpu_has_avx2_fma();
  // Usual pooling (stride = kernel size): every input feeds one output, so each output row routes its own
  // gradients. Otherwise the winners are recorded first, then each input row collects its gradients.
  const bool route_now = max_pairs_per_row(pair_in, n, num_in) <= 1;
  // Left uninitialised: every output row's claims start by filling its row.
  std::unique_ptr<Tag[]> win(new Tag[route_now ? 0 : num_out * channels]);
  at::parallel_for(0, num_out, row_grain(channels), [&](int64_t o0, int64_t o1) {
    std::vector<Tag> scratch(route_now ? channels : 0);
    Tag* w = route_now ? scratch.data() : win.get();
    if (avx2) maxpool_backward_rows_avx2(x, out, dout, channels, g, o0, o1, route_now, w, din);
    else maxpool_backward_rows_base(x, out, dout, channels, g, o0, o1, route_now, w, din);
  });
  if (route_now) return;
  const PairsByRow by_in = group_pairs_by_row(pair_in, pair_out, offsets, kvol, num_in);
  at::parallel_for(0, num_in, row_grain(channels), [&](int64_t i0, int64_t i1) {
    if (avx2) route_rows_avx2(dout, channels, win.get(), by_in, i0, i1, din);
    else route_rows_base(dout, channels, win.get(), by_in, i0, i1, din);
  });
}

// Average pooling walks each output (forward) or input (backward) row over its pairs in kernel-offset order:
// the order the offset-by-offset loops summed in, so the bits are the same, for any thread count. Plain
// loops (no AVX2 clone): an FMA would round the backward's multiply-add once instead of twice, unlike the
// GPU kernels; the pass is memory-bound anyway.
template <typename T>
void avgpool_forward(const T* x, int64_t channels, int64_t num_out, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* out, int32_t* count) {
  const PairsByRow g = group_pairs_by_row(pair_out, pair_in, offsets, kvol, num_out);
  at::parallel_for(0, num_out, row_grain(channels), [&](int64_t o0, int64_t o1) {
    for (int64_t o = o0; o < o1; ++o) {
      T* dst = out + o * channels;
      std::fill(dst, dst + channels, T(0));
      for (int64_t j = g.start[o]; j < g.start[o + 1]; ++j) {
        const T* src = x + static_cast<int64_t>(g.other[j]) * channels;
        for (int64_t c = 0; c < channels; ++c) dst[c] += src[c];
      }
      count[o] = static_cast<int32_t>(g.start[o + 1] - g.start[o]);
      if (count[o] == 0) continue;
      const T inv = T(1) / static_cast<T>(count[o]);
      for (int64_t c = 0; c < channels; ++c) dst[c] *= inv;
    }
  });
}

template <typename T>
void avgpool_backward(const T* dout, const int32_t* count, int64_t channels, int64_t num_in,
                      const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, int64_t kvol,
                      T* din) {
  const PairsByRow by_in = group_pairs_by_row(pair_in, pair_out, offsets, kvol, num_in);
  at::parallel_for(0, num_in, row_grain(channels), [&](int64_t i0, int64_t i1) {
    for (int64_t i = i0; i < i1; ++i) {
      T* gi = din + i * channels;
      for (int64_t j = by_in.start[i]; j < by_in.start[i + 1]; ++j) {
        const int64_t o = by_in.other[j];
        const T inv = T(1) / static_cast<T>(count[o]);
        const T* go = dout + o * channels;
        for (int64_t c = 0; c < channels; ++c) gi[c] += go[c] * inv;
      }
    }
  });
}

#define SPCONV_INSTANTIATE_POOL(T)                                                                           \
  template void maxpool_forward<T>(const T*, int64_t, int64_t, const int32_t*, const int32_t*, const int64_t*, \
                                   int64_t, T*);                                                             \
  template void maxpool_backward<T>(const T*, const T*, const T*, int64_t, int64_t, int64_t, const int32_t*,  \
                                    const int32_t*, const int64_t*, int64_t, T*);                             \
  template void avgpool_forward<T>(const T*, int64_t, int64_t, const int32_t*, const int32_t*, const int64_t*, \
                                   int64_t, T*, int32_t*);                                                   \
  template void avgpool_backward<T>(const T*, const int32_t*, int64_t, int64_t, const int32_t*,              \
                                    const int32_t*, const int64_t*, int64_t, T*);

SPCONV_INSTANTIATE_POOL(float)
SPCONV_INSTANTIATE_POOL(double)
#undef SPCONV_INSTANTIATE_POOL
// int8 inference: the forward max only (exact; x != x is never true, so max_into is a plain max).
template void maxpool_forward<int8_t>(const int8_t*, int64_t, int64_t, const int32_t*, const int32_t*,
                                      const int64_t*, int64_t, int8_t*);

}  // namespace native
}  // namespace spconv
