#include "indice_pairs.h"

#include <ATen/Parallel.h>

#include <algorithm>

#include "hash_table.h"

namespace spconv {
namespace native {

namespace {
// Fixed row blocking: results must not depend on the thread count.
constexpr int64_t kRowBlock = 4096;

int64_t num_blocks(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock; }

// Packed keys of the rows and the row order that sorts them: visiting rows in key order makes
// consecutive hash lookups land on neighbouring slots.
void sorted_keys(const int32_t* indices, int64_t n, const ConvGeometry& g, std::vector<int64_t>& keys,
                 std::vector<int32_t>& order) {
  const int64_t stride = 1 + g.ndim;
  keys.resize(static_cast<size_t>(n));
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) keys[i] = pack_key(indices[i * stride], indices + i * stride + 1, g.in_shape, g.ndim);
  });
  std::vector<std::pair<int64_t, int32_t>> kv(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) kv[i] = {keys[i], static_cast<int32_t>(i)};
  // Sort fixed slices in parallel, then merge them pairwise (the (key, row) order is total: same result).
  // Small inputs sort in place: a parallel region costs more than the sort there.
  const int64_t kSlices = n < 16384 ? 1 : 8;
  std::vector<int64_t> bound(kSlices + 1);
  for (int64_t s = 0; s <= kSlices; ++s) bound[s] = n * s / kSlices;
  at::parallel_for(0, kSlices, 1, [&](int64_t s0, int64_t s1) {
    for (int64_t s = s0; s < s1; ++s) std::sort(kv.begin() + bound[s], kv.begin() + bound[s + 1]);
  });
  for (int64_t width = 1; width < kSlices; width *= 2) {
    at::parallel_for(0, kSlices / (2 * width), 1, [&](int64_t m0, int64_t m1) {
      for (int64_t m = m0; m < m1; ++m) {
        const int64_t lo = bound[2 * m * width], mid = bound[(2 * m + 1) * width], hi = bound[(2 * m + 2) * width];
        std::inplace_merge(kv.begin() + lo, kv.begin() + mid, kv.begin() + hi);
      }
    });
  }
  order.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = kv[i].second;
}

// Per-dimension offsets of every kernel offset index, computed once.
std::vector<int32_t> kernel_offsets(const ConvGeometry& g) {
  std::vector<int32_t> offs(static_cast<size_t>(g.kvol * g.ndim));
  for (int64_t k = 0; k < g.kvol; ++k) unravel_offset(k, g.ksize, g.ndim, offs.data() + k * g.ndim);
  return offs;
}
}  // namespace

int64_t build_subm_map(const int32_t* indices, int64_t n, const ConvGeometry& g, KernelMap& map) {
  const int nd = g.ndim;
  const int64_t stride = 1 + nd;
  std::vector<int64_t> keys;
  std::vector<int32_t> order;
  sorted_keys(indices, n, g, keys, order);
  CoordHashTable table(n);
  for (int64_t i = 0; i < n; ++i) {
    int32_t prev = table.insert(keys[i], static_cast<int32_t>(i));
    if (prev != i) return i;
  }
  const std::vector<int32_t> offs = kernel_offsets(g);
  map.rows_are_outputs = true;
  map.num_out = n;
  map.table.reset(new int32_t[static_cast<size_t>(n * g.kvol)]);
  int32_t* out = map.table.get();
  // A neighbour's key is the row's key plus a per-offset delta, once the neighbour is known to be inside
  // the grid (checked per dimension): no key packing in the inner loop.
  std::vector<int64_t> delta(static_cast<size_t>(g.kvol), 0);
  std::vector<int32_t> shift(static_cast<size_t>(g.kvol * nd));
  for (int64_t k = 0; k < g.kvol; ++k) {
    int64_t place = 1;
    for (int d = nd - 1; d >= 0; --d) {
      const int32_t s = (offs[k * nd + d] - g.ksize[d] / 2) * g.dilation[d];
      shift[k * nd + d] = s;
      delta[k] += s * place;
      place *= g.in_shape[d];
    }
  }
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    for (int64_t p = begin; p < end; ++p) {
      const int64_t i = order[p];
      const int32_t* c = indices + i * stride + 1;
      const int64_t key = keys[i];
      for (int64_t k = 0; k < g.kvol; ++k) {
        const int32_t* s = shift.data() + k * nd;
        bool inside = true;
        for (int d = 0; d < nd; ++d)
          inside &= static_cast<uint32_t>(c[d] + s[d]) < static_cast<uint32_t>(g.in_shape[d]);
        out[i * g.kvol + k] = inside ? table.find(key + delta[k]) : -1;
      }
    }
  });
  return -1;
}

void build_conv_map(const int32_t* indices, int64_t n, const ConvGeometry& g, bool transpose, KernelMap& map) {
  const int nd = g.ndim;
  const int64_t stride = 1 + nd;
  const int64_t kvol = g.kvol;
  // Phase 1 (parallel): candidate output keys for every (input, offset).
  const std::vector<int32_t> offs = kernel_offsets(g);
  std::vector<int64_t> keys(static_cast<size_t>(n * kvol), -1);
  at::parallel_for(0, n, 1024, [&](int64_t begin, int64_t end) {
    int32_t o[kMaxDim];
    for (int64_t i = begin; i < end; ++i) {
      const int32_t* row = indices + i * stride;
      for (int64_t k = 0; k < kvol; ++k) {
        const int32_t* koff = offs.data() + k * nd;
        bool ok = transpose ? deconv_output(g, row + 1, koff, o) : conv_output(g, row + 1, koff, o);
        if (ok) keys[i * kvol + k] = pack_key(row[0], o, g.out_shape, nd);
      }
    }
  });
  // Phase 2 (sequential, so output ids are deterministic): unique the outputs, visiting the inputs in
  // key order so that consecutive inserts touch neighbouring slots. Output rows come in first-seen order.
  std::vector<int64_t> in_keys;
  std::vector<int32_t> order;
  sorted_keys(indices, n, g, in_keys, order);
  // Sized by the valid candidates: the unique outputs can't outnumber them (a full table would never stop probing).
  const int64_t candidates = std::count_if(keys.begin(), keys.end(), [](int64_t k) { return k >= 0; });
  CoordHashTable table(candidates);
  map.rows_are_outputs = false;
  map.table.reset(new int32_t[static_cast<size_t>(n * kvol)]);
  std::fill(map.table.get(), map.table.get() + n * kvol, -1);
  int32_t next = 0;
  std::vector<int64_t> out_keys;
  out_keys.reserve(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) {
    for (int64_t t = order[p] * kvol, end = t + kvol; t < end; ++t) {
      int64_t key = keys[t];
      if (key < 0) continue;
      int32_t id = table.insert(key, next);
      if (id == next) {
        ++next;
        out_keys.push_back(key);
      }
      map.table[t] = id;
    }
  }
  // Phase 3 (parallel): decode output keys into coordinates.
  map.num_out = next;
  map.out_indices.resize(static_cast<size_t>(next) * stride);
  int32_t* oi = map.out_indices.data();
  at::parallel_for(0, next, 4096, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t key = out_keys[r];
      for (int d = nd - 1; d >= 0; --d) {
        oi[r * stride + 1 + d] = static_cast<int32_t>(key % g.out_shape[d]);
        key /= g.out_shape[d];
      }
      oi[r * stride] = static_cast<int32_t>(key);
    }
  });
}

std::vector<int64_t> count_pairs(const KernelMap& map, int64_t num_rows, int64_t kvol, int64_t* pair_offsets) {
  const int64_t nb = num_blocks(num_rows);
  std::vector<int64_t> counts(static_cast<size_t>(nb * kvol), 0);
  const int32_t* t = map.table.get();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* c = counts.data() + b * kvol;
      for (int64_t r = b * kRowBlock; r < std::min(num_rows, (b + 1) * kRowBlock); ++r)
        for (int64_t k = 0; k < kvol; ++k) c[k] += t[r * kvol + k] >= 0;
    }
  });
  pair_offsets[0] = 0;
  for (int64_t k = 0; k < kvol; ++k) {
    int64_t s = 0;
    for (int64_t b = 0; b < nb; ++b) s += counts[b * kvol + k];
    pair_offsets[k + 1] = pair_offsets[k] + s;
  }
  return counts;
}

void compact_pairs(const KernelMap& map, int64_t num_rows, int64_t kvol, const int64_t* pair_offsets,
                   std::vector<int64_t> block_counts, int32_t* pair_in, int32_t* pair_out) {
  const int64_t nb = num_blocks(num_rows);
  const int32_t* t = map.table.get();
  // Turn the counts into the start of each (block, offset) run: offsets[k] + pairs of earlier blocks at k.
  std::vector<int64_t>& start = block_counts;
  for (int64_t k = 0; k < kvol; ++k) {
    int64_t pos = pair_offsets[k];
    for (int64_t b = 0; b < nb; ++b) {
      int64_t c = start[b * kvol + k];
      start[b * kvol + k] = pos;
      pos += c;
    }
  }
  int32_t* rows_dst = map.rows_are_outputs ? pair_out : pair_in;
  int32_t* partner_dst = map.rows_are_outputs ? pair_in : pair_out;
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      int64_t* pos = start.data() + b * kvol;
      for (int64_t r = b * kRowBlock; r < std::min(num_rows, (b + 1) * kRowBlock); ++r)
        for (int64_t k = 0; k < kvol; ++k) {
          int32_t p = t[r * kvol + k];
          if (p < 0) continue;
          rows_dst[pos[k]] = static_cast<int32_t>(r);
          partner_dst[pos[k]] = p;
          ++pos[k];
        }
    }
  });
}

}  // namespace native
}  // namespace spconv
