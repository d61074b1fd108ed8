// GPU implementation of get_indice_pairs: hash-table kernel maps on the device. Compaction into pairs
// grouped by offset (rows ascending within an offset, like the CPU route) uses ATen's nonzero.
// SubM outputs are the input rows; regular/transposed outputs are numbered in the CPU route's first-seen order.
#include <ATen/ATen.h>
#include <torch/library.h>

#include <algorithm>
#include <climits>
#include <limits>
#include <numeric>
#include <unordered_set>
#include <vector>

#include "../checks.h"
#include "../op_library.h"
#include "gpu_common.h"

namespace spconv {
namespace ops {
namespace {

// Same message as the CPU route: the first row whose coordinate repeats an earlier row's.
[[noreturn]] void raise_duplicate(const at::Tensor& indices_cpu, const ConvGeometry& g) {
  const int64_t n = indices_cpu.size(0), w = indices_cpu.size(1);
  const int32_t* p = indices_cpu.const_data_ptr<int32_t>();
  std::unordered_set<int64_t> seen;
  int64_t dup = -1;
  for (int64_t i = 0; i < n && dup < 0; ++i)
    if (!seen.insert(pack_key(p[i * w], p + i * w + 1, g.in_shape, g.ndim)).second) dup = i;
  TORCH_CHECK_VALUE(false, "indices row ", dup, " repeats the coordinate of an earlier row; "
                    "submanifold convolution needs unique coordinates");
  std::abort();
}

// The most distinct output keys a regular / transposed conv of n inputs can reach (the hash table's load):
// per dimension a regular conv reaches only the kernel positions o with c + padding - o * dilation divisible
// by the stride (one residue class of o modulo stride / gcd(stride, dilation)); and there are at most
// batch x out-grid sites. A 3^3 stride-2 conv: 8 per input, not 27.
int64_t max_output_keys(const ConvGeometry& g, bool transpose, int64_t n, int64_t batch_size) {
  int64_t per_input = 1, sites = batch_size;  // sites fits: check_coordinates_on_device bounds it by 2^63
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

// table [rows, kvol] int32 (partner or -1) -> pairs grouped by offset, rows ascending within an offset.
void compact(const at::Tensor& table, bool rows_are_outputs, at::Tensor& pair_in, at::Tensor& pair_out,
             at::Tensor& pair_offsets) {
  const int64_t rows = table.size(0), kvol = table.size(1);
  at::Tensor tt = table.t().contiguous();  // [kvol, rows]
  at::Tensor valid = tt.ge(0);
  at::Tensor nz = at::nonzero(valid);  // [P, 2] (k, row), row-major order
  at::Tensor k_idx = nz.select(1, 0), r_idx = nz.select(1, 1);
  at::Tensor partner = tt.view(-1).index_select(0, k_idx * rows + r_idx);
  at::Tensor row = r_idx.to(at::kInt);
  pair_in = rows_are_outputs ? partner : row;
  pair_out = rows_are_outputs ? row : partner;
  at::Tensor counts = valid.sum(1);  // int64 [kvol]
  pair_offsets = at::cat({at::zeros({1}, counts.options()), at::cumsum(counts, 0)});
  (void)kvol;
}

// The CPU route (csrc/native/indice_pairs.cpp) visits the inputs in (coordinate key, row) order, each input's
// offsets ascending, and numbers the outputs in the order it first reaches them. For table [n, kvol] of output
// ids in key order, returns the ids sorted by their first visit: entry s = the id of the s-th output seen.
// Integer min-reductions and sorts only: deterministic.
at::Tensor first_seen_order(const at::Tensor& indices, const ConvGeometry& g, const at::Tensor& table,
                            int64_t num_out) {
  const int64_t n = indices.size(0), kvol = table.size(1);
  at::Tensor key = indices.select(1, 0).to(at::kLong);
  for (int d = 0; d < g.ndim; ++d) key = key * int64_t{g.in_shape[d]} + indices.select(1, d + 1).to(at::kLong);
  at::Tensor by_key = std::get<1>(at::sort(key, /*stable=*/true, /*dim=*/0, /*descending=*/false));
  at::Tensor pos = at::empty({n}, key.options());
  pos.index_put_({by_key}, at::arange(n, key.options()));
  // visit index of candidate (i, k): pos[i] * kvol + k
  at::Tensor visit = (pos.unsqueeze(1) * kvol + at::arange(kvol, key.options()).unsqueeze(0)).reshape({-1});
  at::Tensor ids = table.reshape({-1}).to(at::kLong);
  at::Tensor hit = ids.ge(0);
  at::Tensor first = at::full({num_out}, std::numeric_limits<int64_t>::max(), key.options());
  first.scatter_reduce_(0, ids.masked_select(hit), visit.masked_select(hit), "amin", /*include_self=*/true);
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

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor> get_indice_pairs_gpu(
    const at::Tensor& indices_arg, int64_t batch_size, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
    at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding, at::IntArrayRef dilation, bool subm,
    bool transpose) {
  const int64_t ndim = static_cast<int64_t>(spatial_shape.size());
  const ConvGeometry g =
      check_indice_pairs_args(indices_arg, spatial_shape, out_shape, ksize, stride, padding, dilation, subm);
  check_coordinates_on_device(indices_arg, batch_size, g);
  c10::DeviceGuard guard(indices_arg.device());
  void* stream = current_stream(indices_arg.device());
  at::Tensor indices = indices_arg.contiguous();
  const int64_t n = indices.size(0);
  const int32_t* ip = indices.const_data_ptr<int32_t>();
  auto iopts = indices.options();
  auto lopts = iopts.dtype(at::kLong);
  at::Tensor pair_in, pair_out, pair_offsets;

  if (subm) {
    const int64_t cap = gpu::hash_capacity(n);
    at::Tensor hkeys = at::empty({cap}, lopts), hvals = at::empty({cap}, iopts);
    check_launch(gpu::hash_clear(hkeys.mutable_data_ptr<int64_t>(), hvals.mutable_data_ptr<int32_t>(), cap, stream),
                 "hash_clear");
    at::Tensor flags = at::tensor({INT32_MAX, 0}, iopts);  // smallest duplicate row, table full
    check_launch(gpu::subm_insert(ip, n, g, hkeys.mutable_data_ptr<int64_t>(), hvals.mutable_data_ptr<int32_t>(), cap,
                                  flags.mutable_data_ptr<int32_t>(), flags.mutable_data_ptr<int32_t>() + 1, stream),
                 "subm_insert");
    const at::Tensor flags_host = flags.cpu();
    check_table_not_full(flags_host.const_data_ptr<int32_t>()[1], cap);
    if (flags_host.const_data_ptr<int32_t>()[0] != INT32_MAX) raise_duplicate(indices_arg.cpu().contiguous(), g);
    at::Tensor nbr = at::empty({n, g.kvol}, iopts);
    check_launch(gpu::subm_neighbors(ip, n, g, hkeys.const_data_ptr<int64_t>(), hvals.const_data_ptr<int32_t>(), cap,
                                     nbr.mutable_data_ptr<int32_t>(), stream),
                 "subm_neighbors");
    compact(nbr, /*rows_are_outputs=*/true, pair_in, pair_out, pair_offsets);
    return {indices_arg.clone(), pair_in, pair_out, pair_offsets};  // outputs may not alias inputs
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
  check_table_not_full(full.item<int32_t>(), cap);
  at::Tensor uniq = std::get<0>(at::sort(at::masked_select(hkeys, hkeys.ge(0))));
  const int64_t num_out = uniq.size(0);
  TORCH_CHECK_VALUE(num_out < (int64_t{1} << 31), "too many output coordinates: ", num_out);
  check_launch(gpu::hash_assign_rank(uniq.const_data_ptr<int64_t>(), num_out, hkeys.const_data_ptr<int64_t>(),
                                     hvals.mutable_data_ptr<int32_t>(), cap, stream),
               "hash_assign_rank");
  at::Tensor table = at::empty({n, g.kvol}, iopts);
  check_launch(gpu::hash_lookup(keys.const_data_ptr<int64_t>(), n * g.kvol, hkeys.const_data_ptr<int64_t>(),
                                hvals.const_data_ptr<int32_t>(), cap, table.mutable_data_ptr<int32_t>(), stream),
               "hash_lookup");
  // table holds ranks in key order; renumber them in the CPU route's first-seen order.
  if (num_out > 0) {
    at::Tensor first_seen = first_seen_order(indices, g, table, num_out);
    table = renumber(table, first_seen);
    uniq = uniq.index_select(0, first_seen);
  }
  at::Tensor out_indices = at::empty({num_out, ndim + 1}, iopts);
  check_launch(gpu::decode_keys(uniq.const_data_ptr<int64_t>(), num_out, g, /*use_out_shape=*/true,
                                out_indices.mutable_data_ptr<int32_t>(), stream),
               "decode_keys");
  compact(table, /*rows_are_outputs=*/false, pair_in, pair_out, pair_offsets);
  return {out_indices, pair_in, pair_out, pair_offsets};
}

}  // namespace

SPCONV_GPU_IMPL(m) { m.impl("get_indice_pairs", &get_indice_pairs_gpu); }

}  // namespace ops
}  // namespace spconv
