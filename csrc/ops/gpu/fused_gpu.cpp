// GPU glue of the fused route: neighbour tables with masks and mask-sorted row orders, the
// output-stationary implicit-GEMM convolution, and the split-K dfilter.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <limits>
#include <string>

#include "../checks.h"
#include "../fused_checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

// masks and order of a neighbour table on the device (schema.cpp, build_fused_map).
std::tuple<at::Tensor, at::Tensor> masks_and_order(const at::Tensor& nbr, int64_t num_splits, void* stream) {
  const int64_t num_rows = nbr.size(0), kvol = nbr.size(1);
  at::Tensor masks = at::empty({num_splits, num_rows}, nbr.options());
  // The kernel writes the masks read as unsigned beside them: a stable sort of those gives the order.
  at::Tensor key = at::empty({num_splits, num_rows}, nbr.options().dtype(at::kLong));
  check_launch(gpu::fused_map_masks(nbr.const_data_ptr<int32_t>(), num_rows, kvol, static_cast<int>(num_splits),
                                    masks.mutable_data_ptr<int32_t>(),
                                    reinterpret_cast<unsigned long long*>(key.mutable_data_ptr<int64_t>()), stream),
               "fused_map_masks");
  at::Tensor order = std::get<1>(at::sort(key, /*stable=*/true, /*dim=*/1, /*descending=*/false)).to(at::kInt);
  return {masks, order};
}

std::tuple<at::Tensor, at::Tensor> fused_map_masks_gpu(const at::Tensor& nbr, int64_t num_splits) {
  check_fused_masks_args(nbr, num_splits);
  c10::DeviceGuard guard(nbr.device());
  return masks_and_order(nbr.contiguous(), num_splits, current_stream(nbr.device()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> build_fused_map_gpu(const at::Tensor& pair_in_arg,
                                                                   const at::Tensor& pair_out_arg,
                                                                   const at::Tensor& pair_offsets_arg,
                                                                   int64_t num_rows, int64_t num_splits,
                                                                   const std::optional<at::Tensor>& map_info) {
  check_fused_map_args(pair_in_arg, pair_out_arg, pair_offsets_arg, num_rows, num_splits);
  c10::DeviceGuard guard(pair_in_arg.device());
  void* stream = current_stream(pair_in_arg.device());
  const int64_t kvol = pair_offsets_arg.size(0) - 1, npairs = pair_in_arg.size(0);
  at::Tensor pair_in = pair_in_arg.contiguous(), pair_out = pair_out_arg.contiguous();
  at::Tensor po = pair_offsets_arg.contiguous();
  auto opts = pair_in.options();
  at::Tensor nbr = at::full({num_rows, kvol}, -1, opts);
  // Out-of-range rows and offsets must not write outside the table (input rows are bounded by the features,
  // which fused_conv gets later: here only >= 0): map_info, or one small host copy.
  const bool repeat_free =
      check_pair_rows(pair_in, pair_out, po, std::numeric_limits<int32_t>::max(), num_rows, map_info).repeat_free;
  at::Tensor repeated = repeat_free ? at::Tensor() : at::zeros({1}, opts);  // a repeat-free map needs no flag
  check_launch(gpu::fused_map_fill(pair_in.const_data_ptr<int32_t>(), pair_out.const_data_ptr<int32_t>(),
                                   po.const_data_ptr<int64_t>(), kvol, npairs, num_rows,
                                   nbr.mutable_data_ptr<int32_t>(),
                                   repeat_free ? nullptr : repeated.mutable_data_ptr<int32_t>(), stream),
               "fused_map_fill");
  if (npairs > 0 && !repeat_free) check_no_repeated_output(to_host(repeated).item<int32_t>() != 0);
  auto [masks, order] = masks_and_order(nbr, num_splits, stream);
  return {nbr, masks, order};
}

at::Tensor fused_conv_gpu(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& nbr_arg,
                          const at::Tensor& masks_arg, const at::Tensor& order_arg,
                          const std::optional<at::Tensor>& map_info, bool tf32) {
  check_fused_conv_args(features, filters, nbr_arg, masks_arg, order_arg, /*allow_double=*/false);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), w = filters.contiguous();
  at::Tensor nbr = nbr_arg.contiguous(), masks = masks_arg.contiguous(), order = order_arg.contiguous();
  check_fused_tables(nbr, order, x.size(0), map_info);
  const int64_t n_out = nbr.size(0), kvol = nbr.size(1), cin = x.size(1), cout = w.size(2);
  at::Tensor y = at::empty({n_out, cout}, x.options());
  if (n_out == 0 || cout == 0) return y;
  if (x.size(0) == 0 || cin == 0) return y.zero_();
  check_launch(gpu::fused_conv_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), w.const_data_ptr(),
                                       nbr.const_data_ptr<int32_t>(), masks.const_data_ptr<int32_t>(),
                                       order.const_data_ptr<int32_t>(), n_out, kvol, cin, cout,
                                       static_cast<int>(masks.size(0)), y.mutable_data_ptr(), stream,
                                       /*mirror=*/false, tf32),
               "fused_conv_forward");
  return y;
}

at::Tensor fused_conv_dfilter_gpu(const at::Tensor& features, const at::Tensor& out_grad, const at::Tensor& pair_in,
                                  const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                  const std::optional<at::Tensor>& map_info, bool tf32) {
  check_fused_dfilter_args(features, out_grad, pair_in, pair_out, pair_offsets, /*allow_double=*/false);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  const int64_t kvol = pair_offsets.size(0) - 1, cin = features.size(1), cout = out_grad.size(1);
  const int64_t npairs = pair_in.size(0);
  at::Tensor x = features.contiguous(), dy = out_grad.contiguous();
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), po = pair_offsets.contiguous();
  check_pair_rows(pin, pout, po, x.size(0), dy.size(0), map_info);
  at::Tensor dw = at::empty({kvol, cin, cout}, x.options());
  if (dw.numel() == 0) return dw;
  if (npairs == 0) return dw.zero_();
  // Split-K: enough blocks to fill the device, bounded workspace (<= 32M floats).
  const int64_t slice = kvol * cin * cout;
  const int64_t splits = gpu::fused_dfilter_split_count(npairs, kvol, slice);
  at::Tensor ws = at::empty({splits * slice}, x.options().dtype(at::kFloat));
  check_launch(gpu::fused_conv_dfilter(gpu_dtype(x.scalar_type()), x.const_data_ptr(), dy.const_data_ptr(),
                                       pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                       po.const_data_ptr<int64_t>(), kvol, cin, cout, static_cast<int>(splits),
                                       ws.mutable_data_ptr<float>(), dw.mutable_data_ptr(), stream, tf32),
               "fused_conv_dfilter");
  return dw;
}

// The whole backward of fused_conv on tables, with no host read (schema.cpp): dinput is fused_conv on the
// dinput tables (nbr, masks, order; mirrored: the forward tables of a mirrored map, read column kvol - 1 - k)
// with the filters transposed by the dfilter's reduction kernel; dfilter runs from dw_table.
std::tuple<at::Tensor, at::Tensor> fused_conv_backward_gpu(
    const at::Tensor& features, const at::Tensor& filters, const at::Tensor& out_grad, const at::Tensor& nbr_arg,
    const at::Tensor& masks_arg, const at::Tensor& order_arg, bool mirrored, const at::Tensor& dw_table_arg,
    bool dw_by_output, const at::Tensor& pair_offsets_arg, bool need_dx, bool need_dw,
    const std::optional<at::Tensor>& map_info, bool tf32) {
  check_fused_backward_args(features, filters, out_grad, nbr_arg, masks_arg, order_arg, mirrored, dw_table_arg,
                            dw_by_output, pair_offsets_arg, need_dx, /*allow_double=*/false);
  c10::DeviceGuard guard(features.device());
  void* stream = current_stream(features.device());
  at::Tensor x = features.contiguous(), w = filters.contiguous(), dy = out_grad.contiguous();
  at::Tensor nbr = nbr_arg.contiguous(), masks = masks_arg.contiguous(), order = order_arg.contiguous();
  at::Tensor table = dw_table_arg.contiguous(), po = pair_offsets_arg.contiguous();
  check_fused_backward_tables(nbr, order, table, dw_by_output, x.size(0), dy.size(0), need_dx, need_dw, map_info);
  const int64_t kvol = w.size(0), cin = w.size(1), cout = w.size(2), slice = kvol * cin * cout;
  const auto dt = gpu_dtype(x.scalar_type());
  at::Tensor dx = need_dx ? at::empty({x.size(0), cin}, x.options()) : at::empty({0}, x.options());
  at::Tensor dw = need_dw ? at::empty({kvol, cin, cout}, x.options()) : at::empty({0}, x.options());
  at::Tensor wt = need_dx ? at::empty({kvol, cout, cin}, x.options()) : at::Tensor();
  // The split count is the pair count's (on the device); each offset has at most `rows` pairs.
  const int64_t rows = table.size(0);
  const int64_t splits_max = need_dw ? gpu::fused_dfilter_split_count(rows * kvol, kvol, slice) : 1;
  at::Tensor ws = need_dw ? at::empty({splits_max * slice}, x.options().dtype(at::kFloat)) : at::Tensor();
  if (slice > 0 && (need_dw || need_dx))
    check_launch(gpu::fused_conv_dfilter_table(
                     dt, x.const_data_ptr(), dy.const_data_ptr(), table.const_data_ptr<int32_t>(), rows, dw_by_output,
                     po.const_data_ptr<int64_t>(), kvol, cin, cout, static_cast<int>(splits_max),
                     need_dw ? ws.mutable_data_ptr<float>() : nullptr, need_dw ? dw.mutable_data_ptr() : nullptr,
                     w.const_data_ptr(), need_dx ? wt.mutable_data_ptr() : nullptr, stream, tf32),
                 "fused_conv_dfilter_table");
  if (need_dx && x.size(0) > 0 && cin > 0) {
    if (dy.size(0) == 0 || cout == 0) {
      dx.zero_();
    } else {
      check_launch(gpu::fused_conv_forward(dt, dy.const_data_ptr(), wt.const_data_ptr(),
                                           nbr.const_data_ptr<int32_t>(), masks.const_data_ptr<int32_t>(),
                                           order.const_data_ptr<int32_t>(), x.size(0), kvol, cout, cin,
                                           static_cast<int>(masks.size(0)), dx.mutable_data_ptr(), stream, mirrored,
                                           tf32),
                   "fused_conv_forward");
    }
  }
  return {dx, dw};
}

std::string fused_conv_path_gpu(const at::Tensor& features, bool tf32) {
  c10::DeviceGuard guard(features.device());
  const auto t = features.scalar_type();
  if (t != at::kFloat && t != at::kHalf && t != at::kBFloat16) return "unsupported";
  at::Tensor body = at::empty({2}, features.options().dtype(at::kInt));
  check_launch(gpu::fused_forward_body(body.mutable_data_ptr<int32_t>(), current_stream(features.device())),
               "fused_forward_body");
  return gpu::fused_body_name(gpu_dtype(t), to_host(body).const_data_ptr<int32_t>(), tf32);
}

}  // namespace

SPCONV_GPU_IMPL(m) {
  m.impl("build_fused_map", &build_fused_map_gpu);
  m.impl("fused_map_masks", &fused_map_masks_gpu);
  m.impl("fused_conv", &fused_conv_gpu);
  m.impl("fused_conv_dfilter", &fused_conv_dfilter_gpu);
  m.impl("fused_conv_backward", &fused_conv_backward_gpu);
  m.impl("fused_conv_path", &fused_conv_path_gpu);
}

}  // namespace ops
}  // namespace spconv
