// Coordinate arithmetic shared by host (g++) and device (nvcc/hipcc) code.
// Coordinates are int32 on the API but keys are int64: batch x volume may exceed 2^31.
#pragma once
#include <cstdint>

#if defined(__CUDACC__) || defined(__HIPCC__)
#define SPCONV_HD __host__ __device__ __forceinline__
#else
#define SPCONV_HD inline
#endif

namespace spconv {

constexpr int kMaxDim = 4;

// Everything needed to map input coordinates to output coordinates of one layer.
struct ConvGeometry {
  int ndim;
  int64_t kvol;  // kernel volume
  int32_t in_shape[kMaxDim];
  int32_t out_shape[kMaxDim];
  int32_t ksize[kMaxDim];
  int32_t stride[kMaxDim];
  int32_t padding[kMaxDim];
  int32_t dilation[kMaxDim];
};

// key = ((b * S0 + c0) * S1 + c1) ...; -1 is never a valid key.
SPCONV_HD int64_t pack_key(int32_t b, const int32_t* c, const int32_t* shape, int ndim) {
  int64_t key = b;
  for (int d = 0; d < ndim; ++d) key = key * shape[d] + c[d];
  return key;
}

// Kernel offset index k -> per-dimension offsets (last dimension fastest, like the weight layout).
SPCONV_HD void unravel_offset(int64_t k, const int32_t* ksize, int ndim, int32_t* out) {
  for (int d = ndim - 1; d >= 0; --d) {
    out[d] = static_cast<int32_t>(k % ksize[d]);
    k /= ksize[d];
  }
}

// Submanifold conv: the input feeding output `c` through offset k sits at c + (k - ksize/2) * dilation.
// Returns false when that coordinate is outside the grid.
SPCONV_HD bool subm_neighbor(const ConvGeometry& g, const int32_t* c, const int32_t* koff, int32_t* nb) {
  for (int d = 0; d < g.ndim; ++d) {
    int32_t v = c[d] + (koff[d] - g.ksize[d] / 2) * g.dilation[d];
    if (v < 0 || v >= g.in_shape[d]) return false;
    nb[d] = v;
  }
  return true;
}

// Regular conv: out[o] += W[k] in[o * s - p + k * d]. Given input coordinate c and offset k, finds o.
SPCONV_HD bool conv_output(const ConvGeometry& g, const int32_t* c, const int32_t* koff, int32_t* o) {
  for (int d = 0; d < g.ndim; ++d) {
    int32_t num = c[d] + g.padding[d] - koff[d] * g.dilation[d];
    if (num < 0 || num % g.stride[d] != 0) return false;
    int32_t v = num / g.stride[d];
    if (v >= g.out_shape[d]) return false;
    o[d] = v;
  }
  return true;
}

// Transposed conv: out[c * s - p + k * d] += W[k] in[c].
SPCONV_HD bool deconv_output(const ConvGeometry& g, const int32_t* c, const int32_t* koff, int32_t* o) {
  for (int d = 0; d < g.ndim; ++d) {
    int32_t v = c[d] * g.stride[d] - g.padding[d] + koff[d] * g.dilation[d];
    if (v < 0 || v >= g.out_shape[d]) return false;
    o[d] = v;
  }
  return true;
}

// A 64-bit mix (splitmix64 finalizer): packed keys of neighbours differ in low bits only.
SPCONV_HD uint64_t hash_key(int64_t key) {
  uint64_t x = static_cast<uint64_t>(key);
  x ^= x >> 31;
  x *= 0x7fb5d329728ea185ULL;
  x ^= x >> 27;
  x *= 0x81dadef4bc2dd44dULL;
  x ^= x >> 33;
  return x;
}

}  // namespace spconv
