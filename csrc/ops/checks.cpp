#include "checks.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>

namespace spconv {
namespace ops {

static std::atomic<int64_t> host_copies{0};

at::Tensor to_host(const at::Tensor& t) {
  host_copies.fetch_add(1, std::memory_order_relaxed);
  return t.cpu();
}

int64_t host_copy_count() { return host_copies.load(std::memory_order_relaxed); }

void check_indices(const at::Tensor& indices, int64_t ndim) {
  TORCH_CHECK_TYPE(indices.scalar_type() == at::kInt, "indices must be int32, got ", indices.scalar_type());
  TORCH_CHECK_VALUE(indices.dim() == 2 && indices.size(1) == ndim + 1, "indices must have shape [N, ", ndim + 1,
                    "] (batch then ", ndim, " coordinates) to match spatial_shape, got ", indices.sizes());
}

static void check_list(at::IntArrayRef v, int64_t ndim, const char* name, int64_t min_value) {
  TORCH_CHECK_VALUE(static_cast<int64_t>(v.size()) == ndim, name, " must have ", ndim, " entries, got ", v);
  for (int64_t x : v) TORCH_CHECK_VALUE(x >= min_value, name, " entries must be >= ", min_value, ", got ", v);
}

ConvGeometry make_geometry(int64_t ndim, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
                           at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation) {
  TORCH_CHECK_VALUE(ndim >= 1 && ndim <= kMaxDim, "spatial_shape must have 1 to ", kMaxDim, " entries, got ", ndim);
  check_list(spatial_shape, ndim, "spatial_shape", 1);
  check_list(out_shape, ndim, "out_shape", 0);
  check_list(ksize, ndim, "kernel_size", 1);
  check_list(stride, ndim, "stride", 1);
  check_list(padding, ndim, "padding", 0);
  check_list(dilation, ndim, "dilation", 1);
  ConvGeometry g{};
  g.ndim = static_cast<int>(ndim);
  g.kvol = 1;
  for (int64_t d = 0; d < ndim; ++d) {
    TORCH_CHECK_VALUE(spatial_shape[d] < (int64_t{1} << 31) && out_shape[d] < (int64_t{1} << 31),
                      "spatial_shape entries must fit in int32");
    g.in_shape[d] = static_cast<int32_t>(spatial_shape[d]);
    g.out_shape[d] = static_cast<int32_t>(out_shape[d]);
    g.ksize[d] = static_cast<int32_t>(ksize[d]);
    g.stride[d] = static_cast<int32_t>(stride[d]);
    g.padding[d] = static_cast<int32_t>(padding[d]);
    g.dilation[d] = static_cast<int32_t>(dilation[d]);
    g.kvol *= ksize[d];
  }
  return g;
}

void check_grid_volume(int64_t batch_size, const ConvGeometry& g) {
  TORCH_CHECK_VALUE(batch_size >= 1, "batch_size must be >= 1, got ", batch_size);
  // Keys pack (batch, coordinates) into an int64: batch_size x grid volume must fit, else keys collide.
  for (const int32_t* shape : {g.in_shape, g.out_shape}) {
    int64_t volume = batch_size;
    bool overflow = false;
    for (int d = 0; d < g.ndim; ++d) overflow = overflow || __builtin_mul_overflow(volume, int64_t{shape[d]}, &volume);
    TORCH_CHECK_VALUE(!overflow, "batch_size=", batch_size, " x spatial_shape ",
                      std::vector<int32_t>(shape, shape + g.ndim), " has more than 2^63 sites (64-bit coordinate keys)");
  }
}

void check_coordinates(const at::Tensor& indices_cpu, int64_t batch_size, const ConvGeometry& g) {
  check_grid_volume(batch_size, g);
  const int64_t n = indices_cpu.size(0), w = indices_cpu.size(1);
  const int32_t* p = indices_cpu.const_data_ptr<int32_t>();
  std::atomic<int64_t> bad{n};
  at::parallel_for(0, n, 16384, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const int32_t* r = p + i * w;
      bool ok = r[0] >= 0 && r[0] < batch_size;
      for (int d = 0; d < g.ndim; ++d) ok = ok && r[1 + d] >= 0 && r[1 + d] < g.in_shape[d];
      if (!ok) {
        int64_t cur = bad.load();
        while (i < cur && !bad.compare_exchange_weak(cur, i)) {
        }
        return;
      }
    }
  });
  const int64_t i = bad.load();
  if (i < n) {
    std::vector<int64_t> row(p + i * w, p + (i + 1) * w);
    TORCH_CHECK_VALUE(p[i * w] >= 0 && p[i * w] < batch_size, "indices row ", i, " = ", row,
                      " has a batch index outside [0, batch_size=", batch_size, ")");
    TORCH_CHECK_VALUE(false, "indices row ", i, " = ", row, " has a coordinate outside spatial_shape ",
                      std::vector<int32_t>(g.in_shape, g.in_shape + g.ndim));
  }
}

at::Tensor coordinate_extremes(const at::Tensor& indices) {
  if (indices.size(0) == 0) return at::empty({0}, indices.options().dtype(at::kLong));
  auto lo = std::get<0>(indices.min(0)), hi = std::get<0>(indices.max(0));
  return at::cat({lo, hi}).to(at::kLong);
}

void check_coordinate_extremes(const int64_t* v, const at::Tensor& indices, int64_t batch_size,
                               const ConvGeometry& g) {
  check_grid_volume(batch_size, g);
  if (indices.size(0) == 0) return;
  const int64_t w = indices.size(1);
  bool ok = v[0] >= 0 && v[w] < batch_size;
  for (int d = 0; d < g.ndim; ++d) ok = ok && v[1 + d] >= 0 && v[w + 1 + d] < g.in_shape[d];
  if (!ok) check_coordinates(to_host(indices).contiguous(), batch_size, g);  // raises, naming the first bad row
}

void check_pairs(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                 const at::Tensor& features) {
  TORCH_CHECK_TYPE(pair_in.scalar_type() == at::kInt && pair_out.scalar_type() == at::kInt,
                   "pair_in and pair_out must be int32");
  TORCH_CHECK_TYPE(pair_offsets.scalar_type() == at::kLong, "pair_offsets must be int64");
  TORCH_CHECK_VALUE(pair_in.dim() == 1 && pair_out.dim() == 1 && pair_in.size(0) == pair_out.size(0),
                    "pair_in and pair_out must be 1-D of equal length");
  TORCH_CHECK_VALUE(pair_offsets.dim() == 1 && pair_offsets.size(0) >= 2, "pair_offsets must be 1-D [kvol + 1]");
  TORCH_CHECK_VALUE(pair_in.device() == features.device() && pair_out.device() == features.device() &&
                        pair_offsets.device() == features.device(),
                    "kernel map tensors must be on the features' device ", features.device());
}

void check_pair_positions_args(const at::Tensor& pair_dst, const at::Tensor& pair_offsets, int64_t num_dst) {
  TORCH_CHECK_TYPE(pair_dst.scalar_type() == at::kInt, "pair_dst must be int32, got ", pair_dst.scalar_type());
  TORCH_CHECK_TYPE(pair_offsets.scalar_type() == at::kLong, "pair_offsets must be int64, got ",
                   pair_offsets.scalar_type());
  TORCH_CHECK_VALUE(pair_dst.dim() == 1, "pair_dst must be 1-D, got ", pair_dst.dim(), " dimensions");
  TORCH_CHECK_VALUE(pair_offsets.dim() == 1 && pair_offsets.size(0) >= 2, "pair_offsets must be 1-D [kvol + 1]");
  TORCH_CHECK_VALUE(pair_offsets.device() == pair_dst.device(), "pair_offsets must be on pair_dst's device ",
                    pair_dst.device());
  TORCH_CHECK_VALUE(num_dst >= 0, "num_dst must be >= 0, got ", num_dst);
}

void check_pair_layout_host(const int64_t* offsets, int64_t kvol, int64_t npairs, const int64_t* extremes,
                            int64_t num_in, int64_t num_out) {
  TORCH_CHECK_VALUE(offsets[0] == 0 && offsets[kvol] == npairs, "pair_offsets must start at 0 and end at the ",
                    "number of pairs ", npairs, ", got ", offsets[0], " and ", offsets[kvol]);
  for (int64_t k = 0; k < kvol; ++k)
    TORCH_CHECK_VALUE(offsets[k] <= offsets[k + 1], "pair_offsets must be non-decreasing, but entry ", k + 1, " (",
                      offsets[k + 1], ") is below entry ", k, " (", offsets[k], ")");
  if (extremes == nullptr || npairs == 0) return;
  TORCH_CHECK_VALUE(extremes[0] >= 0 && extremes[1] < num_in, "pair_in holds rows outside [0, ", num_in,
                    "): min ", extremes[0], ", max ", extremes[1]);
  TORCH_CHECK_VALUE(extremes[2] >= 0 && extremes[3] < num_out, "pair_out holds rows outside [0, num_out=", num_out,
                    "): min ", extremes[2], ", max ", extremes[3]);
}

at::Tensor make_map_info(const at::Tensor& offsets_host, int64_t in_rows, int64_t out_rows, bool repeat_free,
                         bool mirrored) {
  // Filled on the host, element by element: no tensor op, so the map's record adds no launch to a GPU map build.
  const at::Tensor offsets = offsets_host.to(at::kLong).contiguous();
  const int64_t m = offsets.numel();
  at::Tensor info = at::empty({m + kMapInfoExtras}, at::dtype(at::kLong));
  int64_t* p = info.mutable_data_ptr<int64_t>();
  std::copy(offsets.const_data_ptr<int64_t>(), offsets.const_data_ptr<int64_t>() + m, p);
  p[m] = in_rows;
  p[m + 1] = out_rows;
  p[m + 2] = (repeat_free ? kMapRepeatFree : 0) | (mirrored ? kMapMirrored : 0);
  return info;
}

std::optional<MapInfo> read_map_info(const std::optional<at::Tensor>& map_info, int64_t kvol, int64_t npairs) {
  if (!map_info.has_value() || !map_info->defined()) return std::nullopt;
  const at::Tensor& t = *map_info;
  TORCH_CHECK_VALUE(t.device().is_cpu() && t.scalar_type() == at::kLong && t.dim() == 1 &&
                        t.size(0) == kvol + 1 + kMapInfoExtras,
                    "map_info must be a CPU int64 tensor [kvol + 4 = ", kvol + 1 + kMapInfoExtras,
                    "] (as get_indice_pairs returns it), got ", t.scalar_type(), " ", t.sizes(), " on ", t.device());
  at::Tensor c = t.contiguous();
  const int64_t* h = c.const_data_ptr<int64_t>();
  check_pair_layout_host(h, kvol, npairs < 0 ? h[kvol] : npairs, nullptr, 0, 0);
  const int64_t in_rows = h[kvol + 1], out_rows = h[kvol + 2];
  TORCH_CHECK_VALUE(in_rows >= 0 && out_rows >= 0, "map_info row counts must be >= 0, got ", in_rows, " and ",
                    out_rows);
  const int64_t flags = h[kvol + 3];
  return MapInfo{c.narrow(0, 0, kvol + 1), in_rows, out_rows, (flags & kMapRepeatFree) != 0,
                 (flags & kMapMirrored) != 0};
}

HostPairOffsets check_pair_rows(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                int64_t num_in, int64_t num_out, const std::optional<at::Tensor>& map_info,
                                const at::Tensor& extra) {
  const int64_t kvol = pair_offsets.size(0) - 1, npairs = pair_in.size(0);
  if (auto info = read_map_info(map_info, kvol, npairs)) {
    TORCH_CHECK_VALUE(npairs == 0 || (info->in_rows <= num_in && info->out_rows <= num_out), "map_info says ",
                      "the pairs index ", info->in_rows, " input and ", info->out_rows, " output rows, but there are ",
                      num_in, " and ", num_out);
    return {info->offsets, at::Tensor(), info->repeat_free, info->mirrored};
  }
  std::vector<at::Tensor> parts{pair_offsets.contiguous()};
  if (extra.defined()) parts.push_back(extra.to(at::kLong).reshape({-1}));
  if (npairs > 0) {
    auto in_mm = at::aminmax(pair_in), out_mm = at::aminmax(pair_out);
    parts.push_back(at::stack({std::get<0>(in_mm), std::get<1>(in_mm), std::get<0>(out_mm), std::get<1>(out_mm)})
                        .to(at::kLong));
  }
  const at::Tensor host = to_host(parts.size() == 1 ? parts[0] : at::cat(parts));
  const int64_t n_extra = extra.defined() ? extra.numel() : 0;
  const int64_t* h = host.const_data_ptr<int64_t>();
  check_pair_layout_host(h, kvol, npairs, npairs > 0 ? h + kvol + 1 + n_extra : nullptr, num_in, num_out);
  return {host.narrow(0, 0, kvol + 1), extra.defined() ? host.narrow(0, kvol + 1, n_extra) : at::Tensor()};
}

void check_features(const at::Tensor& features, const char* name) {
  TORCH_CHECK_VALUE(features.dim() == 2, name, " must be 2-D [N, C], got ", features.sizes());
  auto t = features.scalar_type();
  TORCH_CHECK_TYPE(t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16, name,
                   " must be float32, float64, float16 or bfloat16, got ", t);
}

void check_filters(const at::Tensor& filters, const at::Tensor& features, int64_t kvol) {
  TORCH_CHECK_VALUE(filters.dim() == 3 && filters.size(0) == kvol, "filters must be [kvol=", kvol,
                    ", Cin, Cout], got ", filters.sizes());
  TORCH_CHECK_VALUE(filters.size(1) == features.size(1), "filters expect ", filters.size(1),
                    " input channels but features have ", features.size(1));
  TORCH_CHECK_TYPE(filters.scalar_type() == features.scalar_type(), "filters dtype ", filters.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(filters.device() == features.device(), "filters are on ", filters.device(),
                    " but features on ", features.device());
}

ConvGeometry check_indice_pairs_args(const at::Tensor& indices, at::IntArrayRef spatial_shape,
                                     at::IntArrayRef out_shape, at::IntArrayRef ksize, at::IntArrayRef stride,
                                     at::IntArrayRef padding, at::IntArrayRef dilation, bool subm) {
  const int64_t ndim = static_cast<int64_t>(spatial_shape.size());
  check_indices(indices, ndim);
  ConvGeometry g = make_geometry(ndim, spatial_shape, subm ? spatial_shape : out_shape, ksize, stride, padding,
                                 dilation);
  if (subm) {
    for (int64_t d = 0; d < ndim; ++d)
      TORCH_CHECK_VALUE(stride[d] == 1, "submanifold convolution needs stride 1, got ", stride);
  }
  return g;
}

void check_conv_backward_args(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& out_grad,
                              const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets) {
  check_features(features, "features");
  check_features(out_grad, "out_grad");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  check_filters(filters, features, pair_offsets.size(0) - 1);
  TORCH_CHECK_VALUE(out_grad.size(1) == filters.size(2), "out_grad has ", out_grad.size(1),
                    " channels but filters produce ", filters.size(2));
  TORCH_CHECK_TYPE(out_grad.scalar_type() == features.scalar_type(), "out_grad dtype ", out_grad.scalar_type(),
                   " differs from features dtype ", features.scalar_type());
  TORCH_CHECK_VALUE(out_grad.device() == features.device(), "out_grad is on ", out_grad.device(),
                    " but features on ", features.device());
}

void check_pool_args(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                     const at::Tensor& pair_offsets, int64_t num_out, bool allow_int8) {
  const auto t = features.scalar_type();
  if (allow_int8 && t == at::kChar) {
    TORCH_CHECK_VALUE(features.dim() == 2, "features must be 2-D [N, C], got ", features.sizes());
  } else {
    TORCH_CHECK_TYPE(!allow_int8 || t == at::kFloat || t == at::kDouble || t == at::kHalf || t == at::kBFloat16,
                     "features must be float32, float64, float16, bfloat16 or int8, got ", t);
    check_features(features, "features");
  }
  check_pairs(pair_in, pair_out, pair_offsets, features);
  TORCH_CHECK_VALUE(num_out >= 0, "num_out must be >= 0, got ", num_out);
}

static void check_same_device(const at::Tensor& t, const at::Tensor& ref, const char* name, const char* ref_name) {
  TORCH_CHECK_VALUE(t.device() == ref.device(), name, " is on ", t.device(), " but ", ref_name, " on ",
                    ref.device());
}

void check_maxpool_backward_args(const at::Tensor& features, const at::Tensor& out_features,
                                 const at::Tensor& out_grad, const at::Tensor& pair_in, const at::Tensor& pair_out,
                                 const at::Tensor& pair_offsets) {
  for (const at::Tensor* t : {&features, &out_features, &out_grad})
    TORCH_CHECK_TYPE(t->scalar_type() != at::kChar,
                     "int8 max pooling is inference only: indice_maxpool_backward takes floating features");
  check_features(features, "features");
  check_features(out_features, "out_features");
  check_features(out_grad, "out_grad");
  check_pairs(pair_in, pair_out, pair_offsets, features);
  TORCH_CHECK_VALUE(out_features.sizes() == out_grad.sizes(), "out_grad must have the shape of out_features ",
                    out_features.sizes(), ", got ", out_grad.sizes());
  TORCH_CHECK_VALUE(out_features.size(1) == features.size(1), "out_features have ", out_features.size(1),
                    " channels but features have ", features.size(1));
  check_same_device(out_features, features, "out_features", "features");
  check_same_device(out_grad, features, "out_grad", "features");
}

void check_avgpool_backward_args(const at::Tensor& out_grad, const at::Tensor& count, const at::Tensor& pair_in,
                                 const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_in) {
  check_features(out_grad, "out_grad");
  check_pairs(pair_in, pair_out, pair_offsets, out_grad);
  TORCH_CHECK_TYPE(count.scalar_type() == at::kInt, "count must be int32, got ", count.scalar_type());
  TORCH_CHECK_VALUE(count.dim() == 1 && count.size(0) == out_grad.size(0), "count must be [num_out=",
                    out_grad.size(0), "], got ", count.sizes());
  TORCH_CHECK_VALUE(num_in >= 0, "num_in must be >= 0, got ", num_in);
  check_same_device(count, out_grad, "count", "out_grad");
}

}  // namespace ops
}  // namespace spconv
