// Weight layouts of the native route. spconv 2.x stores a conv weight as [Cout, kvol, Cin/G] (KRSC, per group);
// the kernels take filters [kvol, G, Cin/G, Cout/G]: one row-major [cig, cog] matrix per (offset, group), and
// the dinput pass takes each matrix transposed. These are tiled transposes over raw memory, run on every conv call
// (faster than torch's strided copy of the same permutation). Elements are `elem_size` bytes (1, 2, 4 or 8): the
// bits are copied, so any dtype of that size works; 4-byte elements move as whole 16 x 16 tiles through AVX-512
// (8 x 8: AVX2) registers rather than element by element. Work of
// at least ~512 KB runs in parallel, split by blocks of rows; the result does not depend on the thread count.
// Outputs of 4 MB or more (224 channels and up at 3x3x3) are written with streaming stores (weight_layout.cpp).
#pragma once
#include <cstdint>

namespace spconv {
namespace native {

// weight [G * cog, kvol, cig] -> filters [kvol, G, cig, cog].
void weight_to_filters(const void* weight, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* filters,
                       int64_t elem_size);

// filters [kvol, G, cig, cog] -> weight [G * cog, kvol, cig] (the inverse, for the filter gradient).
void filters_to_weight(const void* filters, int64_t groups, int64_t cog, int64_t kvol, int64_t cig, void* weight,
                       int64_t elem_size);

// src [n, rows, cols] -> dst [n, cols, rows], both contiguous.
void transpose_matrices(const void* src, int64_t n, int64_t rows, int64_t cols, void* dst, int64_t elem_size);

}  // namespace native
}  // namespace spconv
