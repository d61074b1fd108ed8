// GPU implementation of the native convolution route: the pairs' rows gathered, one vendor GEMM per kernel offset
// (cuBLAS / hipBLAS, FP32 output for 16-bit inputs), and the products summed into each output row in offset order
// by a position table (gather_scatter.cu): the per-offset scatter-add's bits, with a launch per offset (its GEMM;
// two in backward) plus the gathers and the sum. Within an offset a row appears once, so the sums need no atomics.
// The position tables depend on the map alone: the Python layer makes them once per map (pair_positions) and
// passes them in. The filters are read in place, whatever their strides (the weight's permutation is a view), and
// dfilter is written in the weight's layout, so that neither costs a copy.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// out = a @ b accumulated and returned in out's dtype (FP32 for 16-bit a and b, never rounded to 16 bits in
// between, as on the CPU and fused routes). GPUs: the vendor GEMM reads 16-bit operands and writes FP32
// (mm.dtype_out). CPU tensors (the HIP CPU test build) have no such kernel: the operands are widened first.
void mm_acc(at::Tensor out, const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() == out.scalar_type())
    at::mm_out(out, a, b);
  else if (a.is_cpu())
    at::mm_out(out, a.to(out.scalar_type()), b.to(out.scalar_type()));
  else
    at::mm_out(out, a, b, out.scalar_type());
}

// Rows gathered at once: every pair where they fit in this many bytes of buffers, else runs of whole offsets
// holding at least the largest offset's pairs. 0: the default; debug_native_chunk_rows sets a row count (tests).
constexpr int64_t kChunkBytes = int64_t{256} << 20;
std::atomic<int64_t> chunk_rows_override{0};

int64_t chunk_rows(int64_t max_count, int64_t row_bytes) {
  const int64_t forced = chunk_rows_override.load(std::memory_order_relaxed);
  return std::max(max_count, forced > 0 ? forced : kChunkBytes / std::max<int64_t>(row_bytes, 1));
}

// Calls f(k0, k1) for runs of whole offsets [k0, k1) with at most `limit` pairs (>= every offset's count).
template <typename F>
void for_each_chunk(const int64_t* po, int64_t kvol, int64_t limit, F f) {
  for (int64_t k0 = 0; k0 < kvol;) {
    int64_t k1 = k0 + 1;
    while (k1 < kvol && po[k1 + 1] - po[k0] <= limit) ++k1;
    f(k0, k1);
    k0 = k1;
  }
}

int64_t max_pairs(const int64_t* po, int64_t kvol) {
  int64_t m = 0;
  for (int64_t k = 0; k < kvol; ++k) m = std::max(m, po[k + 1] - po[k]);
  return m;
}

// dst[0, m) = the rows of src named by idx[base, base + m).
void gather_pair_rows(const at::Tensor& src, const at::Tensor& idx, int64_t base, int64_t m, at::Tensor& dst,
                      void* stream) {
  check_launch(gpu::gather_rows(gpu_dtype(src.scalar_type()), src.const_data_ptr(), src.size(1),
                                idx.const_data_ptr<int32_t>() + base, m, dst.mutable_data_ptr(), stream),
               "gather_rows");
}

// The position table of the rows products are summed into: pos[row, k] = the pair's index within offset k.
at::Tensor pair_position_table(const at::Tensor& dst, const at::Tensor& offsets_dev, int64_t n_dst, int64_t kvol,
                               void* stream) {
  at::Tensor pos = at::full({n_dst, kvol}, -1, dst.options());
  check_launch(gpu::pair_positions(dst.const_data_ptr<int32_t>(), offsets_dev.const_data_ptr<int64_t>(), kvol,
                                   dst.size(0), n_dst, pos.mutable_data_ptr<int32_t>(), stream),
               "pair_positions");
  return pos;
}

// The caller's table (checked for its dtype, shape and device; its values are bounded by the sum kernel), or a new
// one.
at::Tensor positions_or_new(const std::optional<at::Tensor>& given, const char* name, const at::Tensor& dst,
                            const at::Tensor& offsets_dev, int64_t n_dst, int64_t kvol, void* stream) {
  if (!given.has_value()) return pair_position_table(dst, offsets_dev, n_dst, kvol, stream);
  const at::Tensor& t = *given;
  TORCH_CHECK_TYPE(t.scalar_type() == at::kInt, name, " must be int32, got ", t.scalar_type());
  TORCH_CHECK_VALUE(t.dim() == 2 && t.size(0) == n_dst && t.size(1) == kvol && t.is_contiguous(), name,
                    " must be a contiguous [", n_dst, ", ", kvol, "] table (pair_positions of this map), got ",
                    t.sizes());
  TORCH_CHECK_VALUE(t.device() == dst.device(), name, " must be on the kernel map's device ", dst.device());
  return t;
}

void sum_chunk(const at::Tensor& products, const at::Tensor& pos, const at::Tensor& offsets_dev, int64_t k0,
               int64_t k1, int64_t base, bool accumulate, at::Tensor& acc, void* stream) {
  const gpu::RowSums r{pos.const_data_ptr<int32_t>(), offsets_dev.const_data_ptr<int64_t>(), pos.size(1), k0, k1,
                       base, acc.size(0), accumulate};
  check_launch(gpu::sum_rows_by_position(gpu_dtype(products.scalar_type()), products.const_data_ptr(), acc.size(1),
                                         r, gpu_dtype(acc.scalar_type()), acc.mutable_data_ptr(), stream),
               "sum_rows_by_position");
}

// acc = sum over the pairs of src[gather[p]] @ (transpose_w ? W[k]^T : W[k]) into row scatter[p].
void gather_mm_sum(const at::Tensor& src, const at::Tensor& w, bool transpose_w, const at::Tensor& gather,
                   const at::Tensor& pos, const at::Tensor& offsets_cpu, const at::Tensor& offsets_dev,
                   at::Tensor& acc, void* stream) {
  const int64_t kvol = w.size(0), c_src = src.size(1), c_dst = acc.size(1);
  const int64_t* po = offsets_cpu.const_data_ptr<int64_t>();
  const int64_t max_count = max_pairs(po, kvol);
  if (max_count == 0 || c_dst == 0) {
    acc.zero_();
    return;
  }
  const int64_t limit = chunk_rows(max_count, c_src * src.element_size() + c_dst * acc.element_size());
  const int64_t rows = std::min(limit, po[kvol]);
  at::Tensor a = at::empty({rows, c_src}, src.options());
  at::Tensor o = at::empty({rows, c_dst}, src.options().dtype(acc.scalar_type()));
  bool accumulate = false;
  for_each_chunk(po, kvol, limit, [&](int64_t k0, int64_t k1) {
    const int64_t base = po[k0], m = po[k1] - base;
    gather_pair_rows(src, gather, base, m, a, stream);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t at_row = po[k] - base, mk = po[k + 1] - po[k];
      if (mk > 0) mm_acc(o.narrow(0, at_row, mk), a.narrow(0, at_row, mk), transpose_w ? w[k].t() : w[k]);
    }
    sum_chunk(o, pos, offsets_dev, k0, k1, base, accumulate, acc, stream);
    accumulate = true;
  });
}

at::Tensor indice_conv_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& pair_in,
                           const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_out,
                           const std::optional<at::Tensor>& map_info,
                           const std::optional<at::Tensor>& out_positions,
                           const std::optional<at::Tensor>& /*in_positions: the autograd backward's*/) {
  check_features(features, "features");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  check_filters(filters, features, pair_offsets.size(0) - 1);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be >= 0, got ", num_out);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po_dev = pair_offsets.contiguous();
  at::Tensor po = check_pair_rows(pin, pout, po_dev, x.size(0), num_out, map_info).offsets;
  const int64_t kvol = filters.size(0);
  const at::Tensor pos = positions_or_new(out_positions, "out_positions", pout, po_dev, num_out, kvol, stream);
  at::Tensor acc = at::empty({num_out, filters.size(2)}, x.options().dtype(acc_type(x.scalar_type())));
  gather_mm_sum(x, filters, /*transpose_w=*/false, pin, pos, po, po_dev, acc, stream);
  return acc.to(features.scalar_type());
}

std::tuple<at::Tensor, at::Tensor> indice_conv_backward_gpu(const at::Tensor& features, const at::Tensor& filters,
                                                            const at::Tensor& out_grad, const at::Tensor& pair_in,
                                                            const at::Tensor& pair_out,
                                                            const at::Tensor& pair_offsets,
                                                            const std::optional<at::Tensor>& map_info,
                                                            const std::optional<at::Tensor>& in_positions) {
  check_conv_backward_args(features, filters, out_grad, pair_in, pair_out, pair_offsets);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), dy = out_grad.contiguous();
  const at::Tensor& w = filters;
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po_dev = pair_offsets.contiguous();
  at::Tensor po = check_pair_rows(pin, pout, po_dev, x.size(0), dy.size(0), map_info).offsets;
  const int64_t kvol = w.size(0), cin = w.size(1), cout = w.size(2);
  const auto acc_t = acc_type(x.scalar_type());
  at::Tensor dx_acc = at::empty({x.size(0), cin}, x.options().dtype(acc_t));
  // dfilter accumulates in FP32 (FP64) and is rounded once, in the weight's layout [Cout, kvol, Cin] (returned as
  // its [kvol, Cin, Cout] view, so that the weight's gradient needs no copy); offsets without pairs are zeroed.
  at::Tensor dw_acc = at::empty({cout, kvol, cin}, w.options().dtype(acc_t)).permute({1, 2, 0});
  const int64_t* pop = po.const_data_ptr<int64_t>();
  for (int64_t k = 0; k < kvol; ++k)
    if (pop[k + 1] == pop[k]) dw_acc[k].zero_();
  const int64_t max_count = max_pairs(pop, kvol);
  if (max_count == 0 || cin == 0) {
    dx_acc.zero_();
    return {dx_acc.to(features.scalar_type()), dw_acc.to(w.scalar_type())};
  }
  // One gather of the output gradient's rows serves dinput and dfilter.
  const int64_t limit = chunk_rows(max_count, (cout + cin) * x.element_size() + cin * dx_acc.element_size());
  const int64_t rows = std::min(limit, pop[kvol]);
  at::Tensor g_dy = at::empty({rows, cout}, x.options()), g_x = at::empty({rows, cin}, x.options());
  at::Tensor o = at::empty({rows, cin}, x.options().dtype(acc_t));
  const at::Tensor pos = positions_or_new(in_positions, "in_positions", pin, po_dev, x.size(0), kvol, stream);
  bool accumulate = false;
  for_each_chunk(pop, kvol, limit, [&](int64_t k0, int64_t k1) {
    const int64_t base = pop[k0], m = pop[k1] - base;
    gather_pair_rows(dy, pout, base, m, g_dy, stream);
    gather_pair_rows(x, pin, base, m, g_x, stream);
    for (int64_t k = k0; k < k1; ++k) {
      const int64_t at_row = pop[k] - base, mk = pop[k + 1] - pop[k];
      if (mk == 0) continue;
      const at::Tensor dyk = g_dy.narrow(0, at_row, mk);
      if (cout > 0) mm_acc(o.narrow(0, at_row, mk), dyk, w[k].t());
      mm_acc(dw_acc[k], g_x.narrow(0, at_row, mk).t(), dyk);
    }
    if (cout > 0) sum_chunk(o, pos, po_dev, k0, k1, base, accumulate, dx_acc, stream);
    accumulate = true;
  });
  if (cout == 0) dx_acc.zero_();
  return {dx_acc.to(features.scalar_type()), dw_acc.to(w.scalar_type())};
}

at::Tensor pair_positions_gpu(const at::Tensor& pair_dst, const at::Tensor& pair_offsets, int64_t num_dst) {
  check_pair_positions_args(pair_dst, pair_offsets, num_dst);
  c10::DeviceGuard guard(pair_dst.device());
  return pair_position_table(pair_dst.contiguous(), pair_offsets.contiguous(), num_dst, pair_offsets.size(0) - 1,
                             current_stream(pair_dst.device()));
}

// Tests: the rows one chunk of the native route gathers (0: the default, sized by bytes); returns the old value.
int64_t debug_native_chunk_rows(int64_t rows) {
  TORCH_CHECK_VALUE(rows >= 0, "rows must be >= 0, got ", rows);
  return chunk_rows_override.exchange(rows);
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("indice_conv", &indice_conv_gpu);
  m.impl("indice_conv_backward", &indice_conv_backward_gpu);
  m.impl("pair_positions", &pair_positions_gpu);
}

SPCONV_DEBUG_SCHEMA_FRAGMENT(m) { m.def("debug_native_chunk_rows(int rows) -> int", &debug_native_chunk_rows); }

}  // namespace ops
}  // namespace spconv
