// GPU implementation of get_indice_pairs: hash-table kernel maps on the device. Compaction into pairs
// grouped by offset (rows ascending within an offset, like the CPU route) uses ATen's nonzero_static.
// One device->host copy per map (the checks, the output count, the pairs per offset: map_info).
// SubM outputs are the input rows; regular/transposed outputs are numbered in the CPU route's first-seen order.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <numeric>
#include <vector>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"
#include "map_common.h"
#include "subm_map.h"

namespace spconv {
namespace ops {
namespace {

// The most distinct output keys a regular / transposed conv of n inputs can reach (the hash table's load):
// per dimension a regular conv reaches only the kernel positions o with c + padding - o * dilation divisible
// by the stride (one residue class of o modulo stride / gcd(stride, dilation)); and there are at most
// batch x out-grid sites. A 3^3 stride-2 conv: 8 per input, not 27.
int64_t max_output_keys(const ConvGeometry& g, bool transpose, int64_t n, int64_t batch_size) {
  int64_t per_input = 1, sites = batch_size;  // sites fits: check_grid_volume bounds it by 2^63
  for (int d = 0; d < g.ndim; ++d) {
    const int64_t k = g.ksize[d], period = g.stride[d] / std::gcd(g.stride[d], g.dilation[d]);
    per_input *= transpose ? k : (k + period - 1) / period;
    sites *= g.out_shape[d];
  }
  return std::min(n * per_input, sites);
}

// Tables are sized at >= 2x their keys, so a full one means a sizing bug: raise rather than lose keys.
void check_table_not_full(int32_t full, int64_t cap) {
  TORCH_CHECK(full == 0, "get_indice_pairs: the coordinate hash table (", cap, " slots) is full");
}

// The inputs' packed coordinate keys (int64 [n]) and their stable sort order.
std::pair<at::Tensor, at::Tensor> input_keys(const at::Tensor& indices, const ConvGeometry& g) {
  at::Tensor key = indices.select(1, 0).to(at::kLong);
  for (int d = 0; d < g.ndim; ++d) key = key * int64_t{g.in_shape[d]} + indices.select(1, d + 1).to(at::kLong);
  at::Tensor by_key = std::get<1>(at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  return {key, by_key};
}

// 1 (int64 [1], on the device) when two inputs share a coordinate: then some output row repeats at one offset.
at::Tensor any_duplicate(const at::Tensor& key, const at::Tensor& by_key) {
  if (key.size(0) < 2) return at::zeros({1}, key.options());
  at::Tensor sorted = key.index_select(0, by_key);
  return sorted.narrow(0, 1, key.size(0) - 1).eq(sorted.narrow(0, 0, key.size(0) - 1)).any().to(at::kLong)
      .reshape({1});
}

// The CPU route (csrc/native/indice_pairs.cpp) visits the inputs in (coordinate key, row) order, each input's
// offsets ascending, and numbers the outputs in the order it first reaches them. For table [n, kvol] of output
// ids in key order, returns the ids sorted by their first visit: entry s = the id of the s-th output seen.
// Integer min-reductions and sorts only: deterministic.
at::Tensor first_seen_order(const at::Tensor& by_key, const at::Tensor& table, int64_t num_out) {
  const int64_t n = table.size(0), kvol = table.size(1);
  auto lopts = by_key.options();
  at::Tensor pos = at::empty({n}, lopts);
  pos.index_put_({by_key}, at::arange(n, lopts));
  // visit index of candidate (i, k): pos[i] * kvol + k; a miss (id -1) offers the largest value to output 0.
  at::Tensor visit = (pos.unsqueeze(1) * kvol + at::arange(kvol, lopts).unsqueeze(0)).reshape({-1});
  at::Tensor ids = table.reshape({-1}).to(at::kLong);
  at::Tensor hit = ids.ge(0);
  constexpr int64_t kNever = std::numeric_limits<int64_t>::max();
  at::Tensor first = at::full({num_out}, kNever, lopts);
  first.scatter_reduce_(0, ids.clamp_min(0), at::where(hit, visit, kNever), "amin", /*include_self=*/true);
  return std::get<1>(at::sort(first, /*stable=*/true, /*dim=*/0, /*descending=*/false));
}

// table entries id -> their position in `order` (-1 stays -1).
at::Tensor renumber(const at::Tensor& table, const at::Tensor& order) {
  at::Tensor rank = at::empty_like(order);
  rank.index_put_({order}, at::arange(order.size(0), order.options()));
  at::Tensor ids = table.to(at::kLong);
  at::Tensor mapped = rank.index_select(0, ids.clamp_min(0).reshape({-1})).reshape(ids.sizes());
  return at::where(ids.ge(0), mapped, ids).to(at::kInt);
}

// Everything the builder must know on the host, in one device->host copy after the kernels ran (they are
// memory-safe on any coordinates: the table probes are bounded): the coordinate extremes, the builder's flags,
// the pairs per offset. Checked in the order the CPU route raises.
struct HostFacts {
  at::Tensor host;  // int64: extremes [2w or 0], the flags' entries [n_flags], counts [kvol]
  int64_t n_ext, n_flags;
  const int64_t* flags() const { return host.const_data_ptr<int64_t>() + n_ext; }
  at::Tensor counts() const { return host.narrow(0, n_ext + n_flags, host.size(0) - n_ext - n_flags); }
};

HostFacts fetch_facts(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g,
                      const std::vector<at::Tensor>& flags, const at::Tensor& counts) {
  at::Tensor ext = coordinate_extremes(indices);
  std::vector<at::Tensor> parts{ext};
  int64_t n_flags = 0;
  for (const auto& f : flags) {
    parts.push_back(f.to(at::kLong).reshape({-1}));
    n_flags += f.numel();
  }
  parts.push_back(counts.to(at::kLong));
  HostFacts f{to_host(at::cat(parts)), ext.size(0), n_flags};
  check_coordinate_extremes(f.host.const_data_ptr<int64_t>(), indices, batch_size, g);
  return f;
}

// pair_offsets from the pairs per offset, on the counts' device (the device copy is made there, not uploaded:
// an upload from pageable memory would wait for the stream).
at::Tensor offsets_of(const at::Tensor& counts) {
  return at::cat({at::zeros({1}, counts.options()), at::cumsum(counts, 0)});
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> get_indice_pairs_gpu(
    const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
    at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool subm,
    bool transpose) {
  const int64_t ndim = static_cast<int64_t>(spatial_shape.size());
  const ConvGeometry g =
      check_indice_pairs_args(indices_arg, spatial_shape, out_shape, ksize, stride, padding, dilation, subm);
  check_grid_volume(batch_size, g);
  c10::DeviceGuard guard(indices_arg.device());
  void* stream = current_stream(indices_arg.device());
  at::Tensor indices = indices_arg.contiguous();
  const int64_t n = indices.size(0);
  const int32_t* ip = indices.const_data_ptr<int32_t>();
  auto iopts = indices.options();
  auto lopts = iopts.dtype(at::kLong);
  at::Tensor pair_in, pair_out;

  if (subm) {  // subm_map_gpu.cpp: three kernels, then the one host read
    const SubmMap m = build_subm_map(indices, batch_size, g, /*num_splits=*/0);
    auto [sub_in, sub_out, info] = subm_pairs_of(indices, batch_size, g, m.nbr, m.offsets, m.status);
    return {indices_arg.clone(), sub_in, sub_out, m.offsets, info, m.nbr};  // outputs may not alias inputs
  }

  at::Tensor keys = at::empty({n * g.kvol}, lopts);
  check_launch(gpu::conv_candidate_keys(ip, n, g, transpose, keys.mutable_data_ptr<int64_t>(), stream),
               "conv_candidate_keys");
  const int64_t cap = gpu::hash_capacity(max_output_keys(g, transpose, n, batch_size));
  at::Tensor hkeys = at::empty({cap}, lopts), hvals = at::empty({cap}, iopts);
  check_launch(gpu::hash_clear(hkeys.mutable_data_ptr<int64_t>(), hvals.mutable_data_ptr<int32_t>(), cap, stream),
               "hash_clear");
  at::Tensor full = at::zeros({1}, iopts);
  check_launch(gpu::hash_insert_keys(keys.const_data_ptr<int64_t>(), n * g.kvol, hkeys.mutable_data_ptr<int64_t>(),
                                     cap, full.mutable_data_ptr<int32_t>(), stream),
               "hash_insert_keys");
  const auto [in_key, by_key] = input_keys(indices, g);
  // Every valid candidate reaches an output (all were inserted), so its offset's pair count is known now.
  const at::Tensor counts = keys.view({n, g.kvol}).ge(0).sum(0);
  const HostFacts f = fetch_facts(indices, batch_size, g,
                                  {full, hkeys.ge(0).sum().reshape({1}), any_duplicate(in_key, by_key)}, counts);
  check_table_not_full(static_cast<int32_t>(f.flags()[0]), cap);
  const int64_t num_out = f.flags()[1];
  TORCH_CHECK_VALUE(num_out < (int64_t{1} << 31), "too many output coordinates: ", num_out);
  // Empty slots hold -1 and sort first: the last num_out keys are the outputs, ascending.
  at::Tensor uniq = std::get<0>(at::sort(hkeys)).narrow(0, cap - num_out, num_out);
  check_launch(gpu::hash_assign_rank(uniq.const_data_ptr<int64_t>(), num_out, hkeys.const_data_ptr<int64_t>(),
                                     hvals.mutable_data_ptr<int32_t>(), cap, stream),
               "hash_assign_rank");
  at::Tensor table = at::empty({n, g.kvol}, iopts);
  check_launch(gpu::hash_lookup(keys.const_data_ptr<int64_t>(), n * g.kvol, hkeys.const_data_ptr<int64_t>(),
                                hvals.const_data_ptr<int32_t>(), cap, table.mutable_data_ptr<int32_t>(), stream),
               "hash_lookup");
  // table holds ranks in key order; renumber them in the CPU route's first-seen order.
  if (num_out > 0) {
    at::Tensor first_seen = first_seen_order(by_key, table, num_out);
    table = renumber(table, first_seen);
    uniq = uniq.index_select(0, first_seen);
  }
  at::Tensor out_indices = at::empty({num_out, ndim + 1}, iopts);
  check_launch(gpu::decode_keys(uniq.const_data_ptr<int64_t>(), num_out, g, /*use_out_shape=*/true,
                                out_indices.mutable_data_ptr<int32_t>(), stream),
               "decode_keys");
  const at::Tensor offsets = offsets_of(f.counts());
  compact_table(table, offsets.const_data_ptr<int64_t>()[g.kvol], /*rows_are_outputs=*/false, pair_in, pair_out);
  return {out_indices, pair_in, pair_out, offsets_of(counts),
          make_map_info(offsets, n, num_out, /*repeat_free=*/f.flags()[2] == 0), table};
}

}  // namespace

SPCONV_GPU_IMPL(m) { m.impl("get_indice_pairs", &get_indice_pairs_gpu); }

}  // namespace ops
}  // namespace spconv
