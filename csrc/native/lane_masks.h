// Masks of the first `lanes` lanes of a vector, for the last, partial vector of a row (AVX2: a lane mask
// vector for maskload / maskstore; AVX-512: a k-mask). Counts at or past the vector's width select every lane,
// counts at or below 0 none.
#pragma once
#include <cstdint>

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>

namespace spconv {
namespace native {

// The first `lanes` (0-8) of 8 int32 lanes set.
SPCONV_TARGET_AVX2 inline __m256i tail_mask(int64_t lanes) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(lanes)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// The first `lanes` of 16. Plain integer arithmetic: no ISA attribute, so every AVX-512 body inlines it.
inline __mmask16 lanes16(int64_t lanes) {
  return lanes >= 16 ? __mmask16(0xffff) : __mmask16((1u << (lanes > 0 ? lanes : 0)) - 1u);
}

}  // namespace native
}  // namespace spconv
#endif  // SPCONV_HAVE_AVX2_PATH
