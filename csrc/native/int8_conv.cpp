// The dispatch to the int8 convolution bodies, and the portable one.
#include "int8_conv.h"

#include "int8_conv_common.h"
#include "simd.h"

namespace spconv {
namespace native {

bool int8_conv(const Int8Conv& a) {
  switch (int8_conv_path()) {
    case Int8Path::kAvx512Vnni: return int8_conv_avx512_vnni(a);
    case Int8Path::kAvx2: return int8_conv_avx2(a);
    default: return int8_conv_generic(a);
  }
}

// Row by row over the present columns; int32 products of int8 values, which the compiler vectorises for the
// baseline ISA.
bool int8_conv_generic(const Int8Conv& a) {
  using namespace int8;
  const int64_t cin = a.cin, cout = a.cout;
  return for_each_block(a, [&] {
    return [&, acc = std::make_unique<int32_t[]>(kBlockRows * std::max<int64_t>(cout, 1)),
            col = std::make_unique<BlockColumn>()](int64_t b, bool& bad) {
      const int64_t o0 = b * kBlockRows, rows = std::min(kBlockRows, a.num_out - o0);
      std::fill_n(acc.get(), rows * cout, 0);
      for (int64_t j = 0; j < a.cols; ++j) {
        gather_column(a, o0, rows, j, nullptr, nullptr, *col, bad);
        const int8_t* wk = a.w + (j % a.kvol) * cin * cout;
        for (int p = 0; p < col->n; ++p) {
          int32_t* dst = acc.get() + col->row[p] * cout;
          const int8_t* xr = a.x + static_cast<int64_t>(col->in[p]) * cin;
          for (int64_t i = 0; i < cin; ++i) {
            const int32_t xv = xr[i];
            const int8_t* wr = wk + i * cout;
            for (int64_t c = 0; c < cout; ++c) dst[c] += xv * static_cast<int32_t>(wr[c]);
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r)
        for (int64_t c = 0; c < cout; ++c)
          a.out[(o0 + r) * cout + c] = requantize(a, o0 + r, c, acc[r * cout + c]);
    };
  });
}

#if !SPCONV_HAVE_AVX2_PATH
bool int8_conv_avx2(const Int8Conv& a) { return int8_conv_generic(a); }
bool int8_conv_avx512_vnni(const Int8Conv& a) { return int8_conv_generic(a); }
#endif

}  // namespace native
}  // namespace spconv
