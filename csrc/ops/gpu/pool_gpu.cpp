// GPU glue of sparse max/avg pooling (kernels in csrc/hip/pool.cu): same checks, dtypes and results as the
// CPU glue (csrc/ops/cpu/pool_kernel.cpp). FP16/BF16 features are read as they are and computed in FP32;
// results come back in the input's dtype. The max pooling forward also takes int8 features (exact).
// Two forms: over the pairs (one launch per kernel offset) and over the map's neighbour tables (one launch
// per op; schema.cpp, "pooling over neighbour tables").
#include <ATen/ATen.h>
#include <torch/library.h>

#include <limits>

#include "../checks.h"
#include "../grouped_checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

at::ScalarType acc_type(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

// The shared pair checks: with map_info on the host alone; else one device->host copy, which for the avg
// backward also fetches the smallest count a pair reaches. Returns the host copy of pair_offsets that the
// launchers walk.
at::Tensor checked_host_offsets(const at::Tensor& pin, const at::Tensor& pout, const at::Tensor& pair_offsets,
                                int64_t num_in, int64_t num_out, const std::optional<at::Tensor>& map_info,
                                const at::Tensor* count = nullptr) {
  if (map_info.has_value() && map_info->defined())  // count is trusted with the map (checks.h)
    return check_pair_rows(pin, pout, pair_offsets, num_in, num_out, map_info).offsets;
  const bool with_count = count != nullptr && pin.size(0) > 0 && count->size(0) > 0;
  at::Tensor smallest;
  if (with_count) {
    // Clamped so that an out-of-range pair_out cannot trip a device-side assert before the range check
    // rejects it; once that check passes the clamp changes nothing.
    at::Tensor rows = pout.to(at::kLong).clamp(0, count->size(0) - 1);
    smallest = count->index_select(0, rows).min().reshape({1});
  }
  HostPairOffsets host = check_pair_rows(pin, pout, pair_offsets, num_in, num_out, std::nullopt, smallest);
  if (count != nullptr && pin.size(0) > 0)  // every output a pair reaches needs count >= 1: the backward divides
    TORCH_CHECK_VALUE(with_count && host.extra.const_data_ptr<int64_t>()[0] >= 1,
                      "count must be >= 1 for every output reached by a pair");
  return host.offsets;
}

at::Tensor indice_maxpool_gpu(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                              const at::Tensor& pair_offsets, int64_t num_out, const std::optional<at::Tensor>& map_info) {
  check_pool_args(features, pair_in, pair_out, pair_offsets, num_out, /*allow_int8=*/true);
  const bool int8 = features.scalar_type() == at::kChar;
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), num_out, map_info);
  at::Tensor x = features.contiguous();
  // Max only selects, so the output can stay in the storage dtype: equal to computing in FP32 and rounding.
  at::Tensor out = at::zeros({num_out, x.size(1)}, x.options());
  if (int8) {
    check_launch(gpu::maxpool_forward_int8(x.const_data_ptr<int8_t>(), x.size(1), pin.const_data_ptr<int32_t>(),
                                           pout.const_data_ptr<int32_t>(), po.const_data_ptr<int64_t>(),
                                           po.size(0) - 1, out.mutable_data_ptr<int8_t>(),
                                           current_stream(features.device())),
                 "maxpool_forward_int8");
    return out;
  }
  check_launch(gpu::maxpool_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), x.size(1),
                                    pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                    po.const_data_ptr<int64_t>(), po.size(0) - 1, out.mutable_data_ptr(),
                                    current_stream(features.device())),
               "maxpool_forward");
  return out;
}

at::Tensor indice_maxpool_backward_gpu(const at::Tensor& features, const at::Tensor& out_features,
                                       const at::Tensor& out_grad, const at::Tensor& pair_in,
                                       const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                       const std::optional<at::Tensor>& map_info) {
  check_maxpool_backward_args(features, out_features, out_grad, pair_in, pair_out, pair_offsets);
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), out_features.size(0), map_info);
  // The kernel reads one dtype. Mixed dtypes (not what autograd passes) go through the compute type, exactly
  // as the CPU glue converts each of them.
  const auto t = features.scalar_type();
  const bool same = out_features.scalar_type() == t && out_grad.scalar_type() == t;
  const auto kt = same ? t : acc_type(t);
  at::Tensor x = features.to(kt).contiguous(), y = out_features.to(kt).contiguous();
  at::Tensor dy = out_grad.to(kt).contiguous();
  const int64_t c = x.size(1);
  at::Tensor claimed = at::zeros({y.size(0) * c}, x.options().dtype(at::kByte));
  at::Tensor dx = at::zeros({x.size(0), c}, x.options().dtype(acc_type(kt)));
  check_launch(gpu::maxpool_backward(gpu_dtype(kt), x.const_data_ptr(), y.const_data_ptr(), dy.const_data_ptr(), c,
                                     pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                     po.const_data_ptr<int64_t>(), po.size(0) - 1,
                                     claimed.mutable_data_ptr<uint8_t>(), dx.mutable_data_ptr(),
                                     current_stream(features.device())),
               "maxpool_backward");
  return dx.to(t);
}

std::tuple<at::Tensor, at::Tensor> indice_avgpool_gpu(const at::Tensor& features, const at::Tensor& pair_in,
                                                      const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                                      int64_t num_out, const std::optional<at::Tensor>& map_info) {
  check_pool_args(features, pair_in, pair_out, pair_offsets, num_out);
  c10::DeviceGuard guard(features.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, features.size(0), num_out, map_info);
  at::Tensor x = features.contiguous();
  at::Tensor acc = at::zeros({num_out, x.size(1)}, x.options().dtype(acc_type(x.scalar_type())));
  at::Tensor count = at::zeros({num_out}, pin.options());
  check_launch(gpu::avgpool_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), x.size(1), num_out,
                                    pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                    po.const_data_ptr<int64_t>(), po.size(0) - 1, acc.mutable_data_ptr(),
                                    count.mutable_data_ptr<int32_t>(), current_stream(features.device())),
               "avgpool_forward");
  return {acc.to(features.scalar_type()), count};
}

at::Tensor indice_avgpool_backward_gpu(const at::Tensor& out_grad, const at::Tensor& count,
                                       const at::Tensor& pair_in, const at::Tensor& pair_out,
                                       const at::Tensor& pair_offsets, int64_t num_in, const std::optional<at::Tensor>& map_info) {
  check_avgpool_backward_args(out_grad, count, pair_in, pair_out, pair_offsets, num_in);
  c10::DeviceGuard guard(out_grad.device());
  at::Tensor pin = pair_in.contiguous(), pout = pair_out.contiguous(), cnt = count.contiguous();
  at::Tensor po = checked_host_offsets(pin, pout, pair_offsets, num_in, out_grad.size(0), map_info, &cnt);
  at::Tensor dy = out_grad.contiguous();
  at::Tensor dx = at::zeros({num_in, dy.size(1)}, dy.options().dtype(acc_type(dy.scalar_type())));
  check_launch(gpu::avgpool_backward(gpu_dtype(dy.scalar_type()), dy.const_data_ptr(), cnt.const_data_ptr<int32_t>(),
                                     dy.size(1), pin.const_data_ptr<int32_t>(), pout.const_data_ptr<int32_t>(),
                                     po.const_data_ptr<int64_t>(), po.size(0) - 1, dx.mutable_data_ptr(),
                                     current_stream(out_grad.device())),
               "avgpool_backward");
  return dx.to(out_grad.scalar_type());
}

// ---- over neighbour tables ----

// A neighbour table: int32 [rows, kvol] on `like`'s device.
void check_table(const at::Tensor& table, const char* name, const at::Tensor& like) {
  TORCH_CHECK_TYPE(table.scalar_type() == at::kInt, name, " must be int32, got ", table.scalar_type());
  TORCH_CHECK_VALUE(table.dim() == 2 && table.size(1) >= 1 && table.size(1) < (int64_t{1} << 31), name,
                    " must be [num_rows, kvol], got ", table.sizes());
  TORCH_CHECK_VALUE(table.size(0) < (int64_t{1} << 31), name, " has too many rows for int32 row ids: ",
                    table.size(0));
  TORCH_CHECK_VALUE(table.device() == like.device(), name, " is on ", table.device(), " but the features on ",
                    like.device());
}

// The float dtypes of the pool kernels (int8 only where allow_int8).
void check_pool_dtype(const at::Tensor& t, const char* name, bool allow_int8) {
  const auto st = t.scalar_type();
  TORCH_CHECK_TYPE(st == at::kFloat || st == at::kHalf || st == at::kBFloat16 || st == at::kDouble ||
                       (allow_int8 && st == at::kChar),
                   name, " must be float32, float16, bfloat16 or float64", allow_int8 ? " (or int8)" : "", ", got ",
                   st);
}

// The table's entries index n_src rows: trusted with map_info (its row bound, table_rows_bounded), else one
// device->host copy of their extremes. With `count` (the avg backward) the same copy carries the smallest count
// an entry names, which must be >= 1 (the backward divides by it).
void check_table_entries(const at::Tensor& table, const char* name, int64_t n_src,
                         const std::optional<at::Tensor>& map_info, bool reversed,
                         const at::Tensor* count = nullptr) {
  if (table_rows_bounded(table, n_src, map_info, reversed) || table.numel() == 0) return;
  auto [lo, hi] = at::aminmax(table);
  std::vector<at::Tensor> parts{lo.to(at::kLong).reshape({1}), hi.to(at::kLong).reshape({1})};
  if (count != nullptr && n_src > 0) {
    // Entries clamped so that a bad one is reported by the range check, not indexed with; -1 cells read as 2^31.
    at::Tensor named = count->to(at::kLong).index_select(0, table.clamp(0, n_src - 1).flatten().to(at::kLong));
    named = at::where(table.flatten() >= 0, named, std::numeric_limits<int32_t>::max());
    parts.push_back(named.min().reshape({1}));
  }
  const at::Tensor h = to_host(at::cat(parts));
  const int64_t* v = h.const_data_ptr<int64_t>();
  TORCH_CHECK_VALUE(v[0] >= -1 && v[1] < n_src, name, " holds rows outside [-1, ", n_src, "): min ", v[0], ", max ",
                    v[1]);
  if (count != nullptr && n_src > 0)
    TORCH_CHECK_VALUE(v[2] >= 1, "count must be >= 1 for every output ", name, " names, got ", v[2]);
}

// argmax bytes per element for a kernel volume: uint8 while the offsets and the none mark (255) fit.
int argmax_bytes(int64_t kvol) { return kvol < 255 ? 1 : 4; }
at::ScalarType argmax_dtype(int64_t kvol) { return kvol < 255 ? at::kByte : at::kInt; }

// features [num_in, C]; nbr [num_out, kvol]; nbr_t [num_in or 0, kvol]: the reversed table, which only the
// backward reads (its rows also say whether the forward records the argmax).
void check_table_pool_args(const at::Tensor& features, const at::Tensor& nbr, const at::Tensor& nbr_t,
                           bool allow_int8) {
  TORCH_CHECK_VALUE(features.dim() == 2, "features must be 2-D [N, C], got ", features.sizes());
  check_pool_dtype(features, "features", allow_int8);
  check_table(nbr, "nbr", features);
  check_table(nbr_t, "nbr_t", features);
  TORCH_CHECK_VALUE(nbr_t.size(1) == nbr.size(1), "nbr_t must have nbr's kernel volume ", nbr.size(1), ", got ",
                    nbr_t.sizes());
  TORCH_CHECK_VALUE(nbr_t.size(0) == 0 || nbr_t.size(0) == features.size(0), "nbr_t must have one row per input (",
                    features.size(0), ") or none, got ", nbr_t.sizes());
}

std::tuple<at::Tensor, at::Tensor> indice_maxpool_table_gpu(const at::Tensor& features, const at::Tensor& nbr_arg,
                                                            const at::Tensor& nbr_t,
                                                            const std::optional<at::Tensor>& map_info) {
  check_table_pool_args(features, nbr_arg, nbr_t, /*allow_int8=*/true);
  c10::DeviceGuard guard(features.device());
  at::Tensor x = features.contiguous(), nbr = nbr_arg.contiguous();
  check_table_entries(nbr, "nbr", x.size(0), map_info, /*reversed=*/false);
  const int64_t n_out = nbr.size(0), kvol = nbr.size(1), c = x.size(1);
  const bool int8 = x.scalar_type() == at::kChar;
  const bool with_arg = !int8 && nbr_t.size(0) > 0;
  at::Tensor out = at::empty({n_out, c}, x.options());
  at::Tensor arg = at::empty({with_arg ? n_out : 0, c}, x.options().dtype(argmax_dtype(kvol)));
  void* stream = current_stream(features.device());
  if (int8) {
    check_launch(gpu::maxpool_table_forward_int8(x.const_data_ptr<int8_t>(), c, nbr.const_data_ptr<int32_t>(), n_out,
                                                 kvol, out.mutable_data_ptr<int8_t>(), stream),
                 "maxpool_table_forward_int8");
    return {out, arg};
  }
  check_launch(gpu::maxpool_table_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), c,
                                          nbr.const_data_ptr<int32_t>(), n_out, kvol, out.mutable_data_ptr(),
                                          with_arg ? arg.mutable_data_ptr() : nullptr, argmax_bytes(kvol), stream),
               "maxpool_table_forward");
  return {out, arg};
}

at::Tensor indice_maxpool_table_backward_gpu(const at::Tensor& out_grad, const at::Tensor& argmax,
                                             const at::Tensor& nbr_t_arg, const std::optional<at::Tensor>& map_info) {
  check_features(out_grad, "out_grad");
  check_table(nbr_t_arg, "nbr_t", out_grad);
  const int64_t kvol = nbr_t_arg.size(1), c = out_grad.size(1);
  TORCH_CHECK_TYPE(argmax.scalar_type() == argmax_dtype(kvol), "argmax must be ", argmax_dtype(kvol),
                   " for kernel volume ", kvol, " (indice_maxpool_table's), got ", argmax.scalar_type());
  TORCH_CHECK_VALUE(argmax.device() == out_grad.device(), "argmax is on ", argmax.device(), " but out_grad on ",
                    out_grad.device());
  if (nbr_t_arg.size(0) > 0)
    TORCH_CHECK_VALUE(argmax.dim() == 2 && argmax.size(0) == out_grad.size(0) && argmax.size(1) == c,
                      "argmax must be [num_out=", out_grad.size(0), ", C=", c, "], got ", argmax.sizes(),
                      " (the forward records it only when given nbr_t)");
  c10::DeviceGuard guard(out_grad.device());
  at::Tensor dy = out_grad.contiguous(), nbr_t = nbr_t_arg.contiguous(), arg = argmax.contiguous();
  check_table_entries(nbr_t, "nbr_t", dy.size(0), map_info, /*reversed=*/true);
  at::Tensor dx = at::empty({nbr_t.size(0), c}, dy.options());
  check_launch(gpu::maxpool_table_backward(gpu_dtype(dy.scalar_type()), dy.const_data_ptr(), arg.const_data_ptr(),
                                           argmax_bytes(kvol), c, nbr_t.const_data_ptr<int32_t>(), nbr_t.size(0),
                                           kvol, dx.mutable_data_ptr(), current_stream(out_grad.device())),
               "maxpool_table_backward");
  return dx;
}

std::tuple<at::Tensor, at::Tensor> indice_avgpool_table_gpu(const at::Tensor& features, const at::Tensor& nbr_arg,
                                                            const at::Tensor& nbr_t,
                                                            const std::optional<at::Tensor>& map_info) {
  check_table_pool_args(features, nbr_arg, nbr_t, /*allow_int8=*/false);
  c10::DeviceGuard guard(features.device());
  at::Tensor x = features.contiguous(), nbr = nbr_arg.contiguous();
  check_table_entries(nbr, "nbr", x.size(0), map_info, /*reversed=*/false);
  const int64_t n_out = nbr.size(0), kvol = nbr.size(1), c = x.size(1);
  at::Tensor out = at::empty({n_out, c}, x.options());
  at::Tensor count = at::empty({n_out}, nbr.options());
  check_launch(gpu::avgpool_table_forward(gpu_dtype(x.scalar_type()), x.const_data_ptr(), c,
                                          nbr.const_data_ptr<int32_t>(), n_out, kvol, out.mutable_data_ptr(),
                                          count.mutable_data_ptr<int32_t>(), current_stream(features.device())),
               "avgpool_table_forward");
  return {out, count};
}

at::Tensor indice_avgpool_table_backward_gpu(const at::Tensor& out_grad, const at::Tensor& count,
                                             const at::Tensor& nbr_t_arg, const std::optional<at::Tensor>& map_info) {
  check_features(out_grad, "out_grad");
  check_table(nbr_t_arg, "nbr_t", out_grad);
  TORCH_CHECK_TYPE(count.scalar_type() == at::kInt, "count must be int32, got ", count.scalar_type());
  TORCH_CHECK_VALUE(count.dim() == 1 && count.size(0) == out_grad.size(0), "count must be [num_out=",
                    out_grad.size(0), "], got ", count.sizes());
  TORCH_CHECK_VALUE(count.device() == out_grad.device(), "count is on ", count.device(), " but out_grad on ",
                    out_grad.device());
  c10::DeviceGuard guard(out_grad.device());
  at::Tensor dy = out_grad.contiguous(), nbr_t = nbr_t_arg.contiguous(), cnt = count.contiguous();
  check_table_entries(nbr_t, "nbr_t", dy.size(0), map_info, /*reversed=*/true, &cnt);
  const int64_t kvol = nbr_t.size(1), c = dy.size(1);
  at::Tensor dx = at::empty({nbr_t.size(0), c}, dy.options());
  check_launch(gpu::avgpool_table_backward(gpu_dtype(dy.scalar_type()), dy.const_data_ptr(),
                                           cnt.const_data_ptr<int32_t>(), c, nbr_t.const_data_ptr<int32_t>(),
                                           nbr_t.size(0), kvol, dx.mutable_data_ptr(),
                                           current_stream(out_grad.device())),
               "avgpool_table_backward");
  return dx;
}

// With map_info the table is trusted to be its map's forward table (rows = its outputs, entries its inputs) or
// reversed one, and, when the map is repeat-free, to name each cell once. Else the kernel flags bad entries and
// shared cells, read with one device->host copy.
at::Tensor transpose_neighbour_table_gpu(const at::Tensor& table_arg, int64_t num_rows,
                                         const std::optional<at::Tensor>& map_info) {
  check_table(table_arg, "table", table_arg);
  TORCH_CHECK_VALUE(num_rows >= 0 && num_rows < (int64_t{1} << 31), "num_rows must be in [0, 2^31), got ",
                    num_rows);
  c10::DeviceGuard guard(table_arg.device());
  at::Tensor table = table_arg.contiguous();
  const int64_t rows = table.size(0), kvol = table.size(1);
  bool trusted = false;
  if (auto info = read_map_info(map_info, kvol, /*npairs=*/-1)) {
    const bool fwd = rows == info->out_rows && info->in_rows <= num_rows;
    const bool rev = rows == info->in_rows && info->out_rows <= num_rows;
    TORCH_CHECK_VALUE(fwd || rev, "map_info (", info->in_rows, " inputs, ", info->out_rows,
                      " outputs) does not describe a table of ", rows, " rows transposed to ", num_rows, " rows");
    trusted = info->repeat_free;
  }
  at::Tensor out = at::full({num_rows, kvol}, -1, table.options());
  at::Tensor flags = trusted ? at::Tensor() : at::zeros({2}, table.options());
  check_launch(gpu::transpose_neighbour_table(table.const_data_ptr<int32_t>(), rows, kvol, num_rows,
                                              out.mutable_data_ptr<int32_t>(),
                                              trusted ? nullptr : flags.mutable_data_ptr<int32_t>(),
                                              current_stream(table.device())),
               "transpose_neighbour_table");
  if (!trusted && table.numel() > 0) {
    const at::Tensor h = to_host(flags);
    const int32_t* f = h.const_data_ptr<int32_t>();
    TORCH_CHECK_VALUE(f[0] == 0, "table holds rows outside [-1, ", num_rows, ")");
    TORCH_CHECK_VALUE(f[1] == 0, "table names one row twice at one kernel offset (duplicate coordinates): it has ",
                      "no transpose; split the map with spconv.pytorch.pair_rounds.split_rounds first");
  }
  return out;
}

}  // namespace

// ROCm builds of torch register HIP devices under the CUDA dispatch key too.
SPCONV_GPU_IMPL(m) {
  m.impl("indice_maxpool", &indice_maxpool_gpu);
  m.impl("indice_maxpool_backward", &indice_maxpool_backward_gpu);
  m.impl("indice_avgpool", &indice_avgpool_gpu);
  m.impl("indice_avgpool_backward", &indice_avgpool_backward_gpu);
  m.impl("indice_maxpool_table", &indice_maxpool_table_gpu);
  m.impl("indice_maxpool_table_backward", &indice_maxpool_table_backward_gpu);
  m.impl("indice_avgpool_table", &indice_avgpool_table_gpu);
  m.impl("indice_avgpool_table_backward", &indice_avgpool_table_backward_gpu);
  m.impl("transpose_neighbour_table", &transpose_neighbour_table_gpu);
}

}  // namespace ops
}  // namespace spconv
