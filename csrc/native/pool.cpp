#include "pool.h"

#include <ATen/Parallel.h>

#include <vector>

namespace spconv {
namespace native {

namespace {
// Pairs per task: enough work per task to amortise the scheduling, independent of the thread count.
constexpr int64_t kPairGrain = 512;

// Runs body(p) for every pair p of every offset, offsets strictly in order.
template <typename F>
void for_each_pair_by_offset(const int64_t* offsets, int64_t kvol, const F& body) {
  for (int64_t k = 0; k < kvol; ++k) {
    at::parallel_for(offsets[k], offsets[k + 1], kPairGrain, [&](int64_t b, int64_t e) {
      for (int64_t p = b; p < e; ++p) body(p);
    });
  }
}
}  // namespace

template <typename T>
void maxpool_forward(const T* x, int64_t channels, const int32_t* pair_in, const int32_t* pair_out,
                     const int64_t* offsets, int64_t kvol, T* out) {
  for_each_pair_by_offset(offsets, kvol, [&](int64_t p) {
    const T* src = x + static_cast<int64_t>(pair_in[p]) * channels;
    T* dst = out + static_cast<int64_t>(pair_out[p]) * channels;
    for (int64_t c = 0; c < channels; ++c)
      if (src[c] > dst[c] || src[c] != src[c]) dst[c] = src[c];  // NaN wins and sticks, as in dense max pooling
  });
}

template <typename T>
void maxpool_backward(const T* x, const T* out, const T* dout, int64_t channels, int64_t num_out,
                      const int32_t* pair_in, const int32_t* pair_out, const int64_t* offsets, int64_t kvol,
                      T* din) {
  // claimed[o * C + c]: the gradient of (o, c) was already routed to an earlier offset's input.
  std::vector<uint8_t> claimed(static_cast<size_t>(num_out * channels), 0);
  for_each_pair_by_offset(offsets, kvol, [&](int64_t p) {
    const int64_t i = pair_in[p], o = pair_out[p];
    const T* xi = x + i * channels;
    const T* yo = out + o * channels;
    const T* go = dout + o * channels;
    uint8_t* cl = claimed.data() + o * channels;
    T* gi = din + i * channels;
    for (int64_t c = 0; c < channels; ++c) {
      const bool is_max = xi[c] == yo[c] || (xi[c] != xi[c] && yo[c] != yo[c]);  // a NaN max is its first NaN
      if (!cl[c] && is_max) {
        gi[c] += go[c];
        cl[c] = 1;
      }
    }
  });
}

template <typename T>
void avgpool_forward(const T* x, int64_t channels, int64_t num_out, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* out, int32_t* count) {
  for_each_pair_by_offset(offsets, kvol, [&](int64_t p) {
    const T* src = x + static_cast<int64_t>(pair_in[p]) * channels;
    T* dst = out + static_cast<int64_t>(pair_out[p]) * channels;
    for (int64_t c = 0; c < channels; ++c) dst[c] += src[c];
    ++count[pair_out[p]];
  });
  at::parallel_for(0, num_out, 1024, [&](int64_t b, int64_t e) {
    for (int64_t o = b; o < e; ++o) {
      if (count[o] == 0) continue;
      const T inv = T(1) / static_cast<T>(count[o]);
      for (int64_t c = 0; c < channels; ++c) out[o * channels + c] *= inv;
    }
  });
}

template <typename T>
void avgpool_backward(const T* dout, const int32_t* count, int64_t channels, const int32_t* pair_in,
                      const int32_t* pair_out, const int64_t* offsets, int64_t kvol, T* din) {
  for_each_pair_by_offset(offsets, kvol, [&](int64_t p) {
    const int64_t i = pair_in[p], o = pair_out[p];
    const T inv = T(1) / static_cast<T>(count[o]);
    const T* go = dout + o * channels;
    T* gi = din + i * channels;
    for (int64_t c = 0; c < channels; ++c) gi[c] += go[c] * inv;
  });
}

#define SPCONV_INSTANTIATE_POOL(T)                                                                           \
  template void maxpool_forward<T>(const T*, int64_t, const int32_t*, const int32_t*, const int64_t*, int64_t, \
                                   T*);                                                                      \
  template void maxpool_backward<T>(const T*, const T*, const T*, int64_t, int64_t, const int32_t*,           \
                                    const int32_t*, const int64_t*, int64_t, T*);                             \
  template void avgpool_forward<T>(const T*, int64_t, int64_t, const int32_t*, const int32_t*, const int64_t*, \
                                   int64_t, T*, int32_t*);                                                   \
  template void avgpool_backward<T>(const T*, const int32_t*, int64_t, const int32_t*, const int32_t*,        \
                                    const int64_t*, int64_t, T*);

SPCONV_INSTANTIATE_POOL(float)
SPCONV_INSTANTIATE_POOL(double)
#undef SPCONV_INSTANTIATE_POOL

}  // namespace native
}  // namespace spconv
