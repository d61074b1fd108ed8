// Pieces the int8 convolution bodies share (int8_conv.h): the row blocks and their scheduling, the per-column
// row lists, the scalar epilogue. Plain C++ (no ISA attributes), so every body can inline it.
#pragma once
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>

#include "int8_conv.h"
#include "run_tasks.h"

namespace spconv {
namespace native {
namespace int8 {

// Output rows per task: their int32 accumulators (rows x padded cout) stay in L1/L2 while all columns add in,
// and each column has enough present rows (about a quarter of a SubM table) for full register tiles.
constexpr int64_t kBlockRows = 128;

inline int64_t round_up(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Zeroed, 64-byte aligned scratch (whole cache lines: vector loads never split one).
template <typename T>
struct Aligned {
  std::unique_ptr<T, decltype(&std::free)> p{nullptr, &std::free};
  explicit Aligned(int64_t n) {
    const size_t bytes = static_cast<size_t>(round_up(std::max<int64_t>(n, 1) * int64_t(sizeof(T)), 64));
    p.reset(static_cast<T*>(std::aligned_alloc(64, bytes)));
    if (!p) throw std::bad_alloc();
    std::fill_n(reinterpret_cast<unsigned char*>(p.get()), bytes, 0);
  }
  T* get() const { return p.get(); }
};

// Stops the compiler from contracting the product it is applied to with a later add into an FMA (one rounding
// instead of two): the schema rounds every operation of the epilogue on its own.
template <typename V>
inline __attribute__((always_inline)) V rounded(V v) {
#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
  asm("" : "+v"(v));
  return v;
#else
  volatile V t = v;
  return t;
#endif
}

// nearbyint (ties to even under the default rounding mode), clamped to int8; NaN gives 0 like torch's cast.
inline int8_t to_int8(float v) {
  if (!(v == v)) return 0;
  v = std::nearbyint(v);
  v = v < -128.f ? -128.f : (v > 127.f ? 127.f : v);
  return static_cast<int8_t>(static_cast<int>(v));
}

// The epilogue of output element (o, c) from its exact sum.
inline int8_t requantize(const Int8Conv& a, int64_t o, int64_t c, int32_t acc) {
  float v = rounded(static_cast<float>(acc) * a.scale[c]);
  if (a.bias) v = v + a.bias[c];
  if (a.residual) v = v + rounded(static_cast<float>(a.residual[o * a.cout + c]) * a.residual_scale);
  if (a.activation == 1) v = v < 0.f ? 0.f : v;
  else if (a.activation == 2) v = v < 0.f ? rounded(v * a.alpha) : v;
  return to_int8(v);
}

// The rows of one block present in one table column, and the input row each reads.
struct BlockColumn {
  int n = 0;
  int32_t row[kBlockRows];
  int32_t in[kBlockRows];
};

// Lists the rows of [o0, o0 + rows) whose column j holds an input row; adds that row's byte sum to corr[row]
// (when rowsum is given). Entries outside [-1, num_in) set bad and are skipped. Branch-free: about a quarter
// of a SubM table's entries are present, in no pattern a branch predictor learns.
inline void gather_column(const Int8Conv& a, int64_t o0, int64_t rows, int64_t j, const int32_t* rowsum,
                          int32_t* corr, BlockColumn& col, bool& bad) {
  int n = 0;
  bool odd = false;
  const int32_t* t = a.nbr + o0 * a.cols + j;
  for (int64_t r = 0; r < rows; ++r, t += a.cols) {
    const int32_t i = *t;
    const bool present = static_cast<uint64_t>(static_cast<int64_t>(i)) < static_cast<uint64_t>(a.num_in);
    odd |= !present & (i != -1);
    col.row[n] = static_cast<int32_t>(r);
    col.in[n] = present ? i : 0;
    if (rowsum) corr[r] += present ? rowsum[present ? i : 0] : 0;  // rowsum has a row 0 even for no inputs
    n += present;
  }
  col.n = n;
  bad |= odd;
}

// Runs block(b, bad) for the row blocks b of the output, each on one thread with its own scratch (make_worker
// builds a worker: a callable (int64_t block, bool& bad)). Small problems run on the calling thread: a parallel
// region costs more than they do.
template <typename MakeWorker>
bool for_each_block(const Int8Conv& a, const MakeWorker& make_worker) {
  const int64_t blocks = (a.num_out + kBlockRows - 1) / kBlockRows;
  if (blocks == 0) return true;
  std::atomic<bool> bad{false};
  const double work = double(a.num_out) * double(a.cols) * double(std::max<int64_t>(a.cin, 4)) *
                      double(std::max<int64_t>(a.cout, 16));
  if (blocks == 1 || work < double(1 << 22)) {
    auto worker = make_worker();
    bool b = false;
    for (int64_t t = 0; t < blocks; ++t) worker(t, b);
    return !b;
  }
  run_tasks(blocks, [&] {
    return [&, worker = make_worker()](int64_t t) mutable {
      bool b = false;
      worker(t, b);
      if (b) bad.store(true, std::memory_order_relaxed);
    };
  });
  return !bad.load();
}

}  // namespace int8
}  // namespace native
}  // namespace spconv
