#include "weight_layout.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>

#include "simd.h"

#if SPCONV_HAVE_AVX2_PATH
#include <immintrin.h>
#endif

namespace spconv {
namespace native {

namespace {

// A batch of 2-D transposes: matrix (a, b), a < outer, b < inner, reads src + a * src_outer + b * src_inner and
// writes dst + a * dst_outer + b * dst_inner (in elements): dst[j * ldd + i] = src[i * lds + j], i < rows,
// j < cols.
struct Plan {
  int64_t rows, cols, lds, ldd;
  int64_t outer, src_outer, dst_outer;
  int64_t inner, src_inner, dst_inner;
};

// Tiles of 16 x 16 elements: the tile's 16 source rows stay in L1 while it is written column by column.
constexpr int64_t kTile = 16;
// A parallel task moves at least this many bytes: smaller work stays on the calling thread (a parallel region
// costs more than it saves, and stalls when other processes hold the cores).
constexpr int64_t kTaskBytes = 512 * 1024;

#if SPCONV_HAVE_AVX2_PATH
// A tile row, past the cache when Stream (streams() below checks the alignment).
template <bool Stream>
SPCONV_TARGET_AVX512 inline void store16(uint32_t* d, __m512 v) {
  if constexpr (Stream) _mm512_stream_ps(reinterpret_cast<float*>(d), v);
  else _mm512_storeu_ps(reinterpret_cast<float*>(d), v);
}

// A whole 16 x 16 tile of 4-byte elements through registers: 16 row loads, four rounds of 16 shuffles, 16 row
// stores, where the scalar loop moves one element per load and store (one thread moved a 256-channel float32
// weight at under half the copy bandwidth). Shuffles move bits: any 4-byte dtype, NaN payloads included.
template <bool Stream>
SPCONV_TARGET_AVX512 void transpose16_avx512(const uint32_t* s, int64_t lds, uint32_t* d, int64_t ldd) {
  __m512 r[16], t[16];
  for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(reinterpret_cast<const float*>(s + i * lds));
  // Within each 128-bit lane L: t[2p], t[2p + 1] interleave rows 2p and 2p + 1.
  for (int p = 0; p < 8; ++p) {
    t[2 * p] = _mm512_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm512_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  // r[4q + m], lane L: rows 4q .. 4q + 3 at column 4L + m.
  for (int q = 0; q < 4; ++q) {
    r[4 * q] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    r[4 * q + 1] = _mm512_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
    r[4 * q + 2] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    r[4 * q + 3] = _mm512_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
  }
  // Column 4L + m is lane L of r[m], r[4 + m], r[8 + m], r[12 + m]: a 4 x 4 transpose of 128-bit lanes.
  for (int m = 0; m < 4; ++m) {
    const __m512 a = _mm512_shuffle_f32x4(r[m], r[4 + m], 0x44), b = _mm512_shuffle_f32x4(r[m], r[4 + m], 0xEE);
    const __m512 c = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0x44);
    const __m512 e = _mm512_shuffle_f32x4(r[8 + m], r[12 + m], 0xEE);
    store16<Stream>(d + m * ldd, _mm512_shuffle_f32x4(a, c, 0x88));
    store16<Stream>(d + (4 + m) * ldd, _mm512_shuffle_f32x4(a, c, 0xDD));
    store16<Stream>(d + (8 + m) * ldd, _mm512_shuffle_f32x4(b, e, 0x88));
    store16<Stream>(d + (12 + m) * ldd, _mm512_shuffle_f32x4(b, e, 0xDD));
  }
}

template <bool Stream>
SPCONV_TARGET_AVX2 inline void store8(uint32_t* d, __m256 v) {
  if constexpr (Stream) _mm256_stream_ps(reinterpret_cast<float*>(d), v);
  else _mm256_storeu_ps(reinterpret_cast<float*>(d), v);
}

// The same for an 8 x 8 tile with AVX2: three rounds of 8 shuffles.
template <bool Stream>
SPCONV_TARGET_AVX2 void transpose8_avx2(const uint32_t* s, int64_t lds, uint32_t* d, int64_t ldd) {
  __m256 r[8], t[8];
  for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(reinterpret_cast<const float*>(s + i * lds));
  for (int p = 0; p < 4; ++p) {
    t[2 * p] = _mm256_unpacklo_ps(r[2 * p], r[2 * p + 1]);
    t[2 * p + 1] = _mm256_unpackhi_ps(r[2 * p], r[2 * p + 1]);
  }
  for (int q = 0; q < 2; ++q) {  // r[4q + m], lane L: rows 4q .. 4q + 3 at column 4L + m
    r[4 * q] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0x44);
    r[4 * q + 1] = _mm256_shuffle_ps(t[4 * q], t[4 * q + 2], 0xEE);
    r[4 * q + 2] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0x44);
    r[4 * q + 3] = _mm256_shuffle_ps(t[4 * q + 1], t[4 * q + 3], 0xEE);
  }
  for (int m = 0; m < 4; ++m) {
    store8<Stream>(d + m * ldd, _mm256_permute2f128_ps(r[m], r[4 + m], 0x20));
    store8<Stream>(d + (4 + m) * ldd, _mm256_permute2f128_ps(r[m], r[4 + m], 0x31));
  }
}
#endif

// Which whole-tile kernel transposes 4-byte elements here: 2 AVX-512, 1 AVX2, 0 none (the scalar loop).
int tile_isa() { return cpu_has_avx512f() ? 2 : cpu_has_avx2_fma() ? 1 : 0; }

template <typename E, bool Stream>
void transpose_tiles(const E* s, int64_t lds, int64_t rows, int64_t cols, E* d, int64_t ldd, int isa) {
  for (int64_t i0 = 0; i0 < rows; i0 += kTile) {
    const int64_t i1 = std::min(rows, i0 + kTile);
    for (int64_t j0 = 0; j0 < cols; j0 += kTile) {
      const int64_t j1 = std::min(cols, j0 + kTile);
#if SPCONV_HAVE_AVX2_PATH
      if constexpr (sizeof(E) == 4) {
        if (isa > 0 && i1 - i0 == kTile && j1 - j0 == kTile) {
          const uint32_t* st = reinterpret_cast<const uint32_t*>(s) + i0 * lds + j0;
          uint32_t* dt = reinterpret_cast<uint32_t*>(d) + j0 * ldd + i0;
          if (isa == 2) {
            transpose16_avx512<Stream>(st, lds, dt, ldd);
          } else {  // both halves of an output row's 64 bytes one after the other
            for (int64_t b = 0; b < kTile; b += 8)
              for (int64_t a = 0; a < kTile; a += 8) transpose8_avx2<Stream>(st + a * lds + b, lds, dt + b * ldd + a, ldd);
          }
          continue;
        }
      }
#endif
      for (int64_t j = j0; j < j1; ++j)
        for (int64_t i = i0; i < i1; ++i) d[j * ldd + i] = s[i * lds + j];
    }
  }
}

// Outputs of at least this many bytes are written past the cache (streaming stores). A weight's filters are
// written 64 bytes per tile row, scattered over the whole output, and each ordinary store first reads its line;
// below 4 MB the output stays in cache for the next read and ordinary stores win (docs/routes.md, "Measured
// choices of the CPU kernels").
constexpr int64_t kStreamBytes = int64_t{4} << 20;

// Whether run() streams: whole tiles of 4-byte elements through registers, every tile row's destination
// aligned to a whole vector.
bool streams(const Plan& p, const void* dst, int isa, int64_t elem_size) {
  const int64_t align = isa == 2 ? 64 : 32;
  const int64_t bytes = p.rows * p.cols * p.outer * p.inner * elem_size;
  return elem_size == 4 && isa > 0 && bytes >= kStreamBytes && reinterpret_cast<uintptr_t>(dst) % align == 0 &&
         p.ldd * elem_size % align == 0 && p.dst_outer * elem_size % align == 0 &&
         p.dst_inner * elem_size % align == 0;
}

template <typename E>
void run(const Plan& p, const void* src, void* dst) {
  const E* s = static_cast<const E*>(src);
  E* d = static_cast<E*>(dst);
  // A task takes kTile rows of one inner batch through every outer matrix: in a weight those rows run on in
  // memory from one offset to the next, so the task reads them front to back (sixteen streams the prefetcher
  // follows). Matrix by matrix, each row would be read in short bursts kvol * cig elements apart, which it
  // doesn't follow.
  const int64_t row_blocks = (p.rows + kTile - 1) / kTile;
  const int64_t task_bytes = std::max<int64_t>(kTile * p.cols * p.outer * static_cast<int64_t>(sizeof(E)), 1);
  const int isa = tile_isa();
  const bool stream = streams(p, d, isa, sizeof(E));
  at::parallel_for(0, p.inner * row_blocks, std::max<int64_t>(1, kTaskBytes / task_bytes), [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t b = t / row_blocks, i0 = t % row_blocks * kTile, n = std::min(kTile, p.rows - i0);
      for (int64_t a = 0; a < p.outer; ++a) {
        const E* st = s + a * p.src_outer + b * p.src_inner + i0 * p.lds;
        E* dt = d + a * p.dst_outer + b * p.dst_inner + i0;
        if (stream) transpose_tiles<E, true>(st, p.lds, n, p.cols, dt, p.ldd, isa);
        else transpose_tiles<E, false>(st, p.lds, n, p.cols, dt, p.ldd, isa);
      }
    }
#if SPCONV_HAVE_AVX2_PATH
    if (stream) _mm_sfence();  // the streamed rows are visible before the task ends
#endif
  });
}

void run_bits(const Plan& p, const void* src, void* dst, int64_t elem_size) {
  switch (elem_size) {
    case 1: return run<uint8_t>(p, src, dst);
    case 2: return run<uint16_t>(p, src, dst);
    case 4: return run<uint32_t>(p, src, dst);
    case 8: return run<uint64_t>(p, src, dst);
    default: TORCH_CHECK(false, "weight layout: elements of ", elem_size, " bytes are not supported");
  }
}

}  // namespace

void weight_to_filters(const void* weight, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* filters,
                       int64_t elem_size) {
  // Matrix (k, g): rows o of weight[g * cog + o, k, :] (kvol * cig apart) -> filters[k, g] as [cig, cog].
  const Plan p{cog, cig, kvol * cig, cog, kvol, cig, groups * cig * cog, groups, cog * kvol * cig, cig * cog};
  run_bits(p, weight, filters, elem_size);
}

void filters_to_weight(const void* filters, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* weight,
                       int64_t elem_size) {
  // Matrix (k, g): filters[k, g] as [cig, cog] -> rows o of weight[g * cog + o, k, :].
  const Plan p{cig, cog, cog, kvol * cig, kvol, groups * cig * cog, cig, groups, cig * cog, cog * kvol * cig};
  run_bits(p, filters, weight, elem_size);
}

void transpose_matrices(const void* src, int64_t n, int64_t rows, int64_t cols, void* dst, int64_t elem_size) {
  const Plan p{rows, cols, cols, rows, n, rows * cols, rows * cols, 1, 0, 0};
  run_bits(p, src, dst, elem_size);
}

}  // namespace native
}  // namespace spconv
