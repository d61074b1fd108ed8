#include "indice_pairs.h"

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <bit>
#include <limits>

#include "radix_sort.h"
#include "run_tasks.h"

namespace spconv {
namespace native {

namespace {
// Fixed row blocking: results must not depend on the thread count.
constexpr int64_t kRowBlock = 2048;

int64_t num_blocks(int64_t rows) { return (rows + kRowBlock - 1) / kRowBlock; }

// Rows below which a map's passes stay on the calling thread while parallel regions wait on late threads (a
// busy machine): each of a small map's five passes run in parallel is one more chance to wait for a preempted
// worker.
constexpr int64_t kBusySerialRows = 16384;

// f(b) for each row block b in [0, nb), one block per task of run_tasks: on a quiet machine every block pass
// with two blocks or more is parallel (a 10k-row map has 5 blocks, a 125k-row one 62); on a busy one a small
// map runs on the calling thread and a larger one gets run_tasks' serial start.
template <typename F>
void for_blocks(int64_t nb, const F& f) {
  if (nb * kRowBlock < kBusySerialRows && serial_budget_ns(monotonic_ns()) > 0) {
    for (int64_t b = 0; b < nb; ++b) f(b);
    return;
  }
  run_tasks(nb, [&] { return [&](int64_t b) { f(b); }; });
}

// Packed keys of the rows, in row order.
UninitVector<int64_t> row_keys(const int32_t* indices, int64_t n, const ConvGeometry& g) {
  const int64_t stride = 1 + g.ndim;
  UninitVector<int64_t> keys(static_cast<size_t>(n));
  at::parallel_for(0, n, 1 << 15, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) keys[i] = pack_key(indices[i * stride], indices + i * stride + 1, g.in_shape, g.ndim);
  });
  return keys;
}

// The rows in (key, row) order: keys[s] is the key at sorted position s (plus a trailing sentinel,
// larger than any key), rows[s] its row.
struct SortedRows {
  UninitVector<int64_t> keys;
  UninitVector<int32_t> rows;
};

SortedRows sort_rows(const int32_t* indices, int64_t n, const ConvGeometry& g) {
  SortedRows s;
  const UninitVector<int64_t> keys = row_keys(indices, n, g);
  sort_key_index(keys.data(), n, s.keys, s.rows);
  return s;
}

// Subm offsets, grouped by their leading dimensions: offset k = group * klast + i, where i runs over the
// last dimension. The neighbour of c through k sits at c + lead_shift[group] (leading dimensions) and
// c + last_shift[i] (last dimension); once inside the grid its key is key(c) + lead_delta[group] + last_shift[i].
struct SubmOffsets {
  int64_t groups, klast;
  std::vector<int32_t> lead_shift;  // [groups, ndim - 1]
  std::vector<int64_t> lead_delta;  // [groups]
  std::vector<int32_t> last_shift;  // [klast], ascending
};

SubmOffsets subm_offsets(const ConvGeometry& g) {
  const int nd = g.ndim;
  SubmOffsets o;
  o.klast = g.ksize[nd - 1];
  o.groups = g.kvol / o.klast;
  for (int64_t i = 0; i < o.klast; ++i)
    o.last_shift.push_back(static_cast<int32_t>(i - g.ksize[nd - 1] / 2) * g.dilation[nd - 1]);
  o.lead_delta.assign(static_cast<size_t>(o.groups), 0);
  o.lead_shift.resize(static_cast<size_t>(o.groups * (nd - 1)));
  int32_t off[kMaxDim];
  for (int64_t gr = 0; gr < o.groups; ++gr) {
    unravel_offset(gr * o.klast, g.ksize, nd, off);
    int64_t place = g.in_shape[nd - 1];
    for (int d = nd - 2; d >= 0; --d) {
      const int32_t s = (off[d] - g.ksize[d] / 2) * g.dilation[d];
      o.lead_shift[gr * (nd - 1) + d] = s;
      o.lead_delta[gr] += s * place;
      place *= g.in_shape[d];
    }
  }
  return o;
}

// The row reported for duplicate coordinates: the smallest row whose coordinate an earlier row holds
// (equal keys sit next to each other, ascending by row). -1 when the keys are unique.
int64_t first_repeated_row(const SortedRows& s, int64_t n) {
  int64_t row = -1;
  for (int64_t p = 1; p < n; ++p) {
    if (s.keys[p] == s.keys[p - 1] && (row < 0 || s.rows[p] < row)) row = s.rows[p];
  }
  return row;
}

// key + delta where that can't overflow; INT64_MAX (past every key) where it would.
int64_t add_clamped(int64_t key, int64_t delta) {
  return delta > 0 && key > std::numeric_limits<int64_t>::max() - delta ? std::numeric_limits<int64_t>::max()
                                                                        : key + delta;
}

// Keys are counted this many at a time when a cursor moves forward; the sorted keys (and rows) are padded
// past n with at least this many sentinels.
constexpr int kStep = 8;

// The first position from j on whose key is >= t. The keys before it form a prefix, so counting the keys
// below t in a window of kStep moves the cursor with independent loads and no branch per key.
int64_t advance(const int64_t* sk, int64_t j, int64_t t) {
  while (true) {
    int64_t below = 0;
    for (int m = 0; m < kStep; ++m) below += sk[j + m] < t;
    j += below;
    if (below < kStep) return j;
  }
}

// Matches of one offset group, cursor j at the first key >= the group's smallest target t0. With a
// last-dimension dilation of 1 the targets t0, t0 + 1, ... are consecutive, so the only candidates are the
// klast keys from j on: key t0 + v is the match of offset v. Mismatches go to the junk entry out[klast].
void match_consecutive(const int64_t* sk, const int32_t* rows, int64_t j, int64_t t0, int64_t klast,
                       const uint8_t* inside, int32_t* out) {
  for (int64_t m = 0; m < klast; ++m) {
    const uint64_t v = static_cast<uint64_t>(sk[j + m]) - static_cast<uint64_t>(t0);
    // min, not a conditional: GCC turned the conditional into a branch that mispredicted on half the rows.
    const int64_t i = static_cast<int64_t>(std::min(v, static_cast<uint64_t>(klast)));
    // Arithmetic select (i if inside, else klast): a branch here would mispredict on the sparse data.
    const int64_t keep = -static_cast<int64_t>(inside[i]);
    out[klast + ((i - klast) & keep)] = rows[j + m];
  }
}

// The same for any dilation: targets t0 + shift[i] - shift[0], visited in ascending order.
void match_scan(const int64_t* sk, const int32_t* rows, int64_t j, int64_t t0, const std::vector<int32_t>& shift,
                const uint8_t* inside, int32_t* out) {
  for (size_t i = 0; i < shift.size(); ++i) {
    if (!inside[i]) continue;
    const int64_t target = t0 + (shift[i] - shift[0]);
    while (sk[j] < target) ++j;
    if (sk[j] == target) out[i] = rows[j];
  }
}

// Rows ahead at which match_subm_block requests its table rows.
constexpr int64_t kWriteAhead = 16;

// Subm table entries of the rows at sorted positions [p0, p1). The keys ascend with p, so the keys of
// one offset's neighbours ascend too: each offset group keeps a cursor into the sorted keys that only
// moves forward (a merge of sorted lists, no lookups), started by one binary search per block.
void match_subm_block(const int32_t* indices, const ConvGeometry& g, const SortedRows& s, int64_t n,
                      const SubmOffsets& o, int64_t p0, int64_t p1, int32_t* out) {
  const int nd = g.ndim;
  const int lead = nd - 1;
  const int64_t kvol = g.kvol, klast = o.klast;
  const bool consecutive = g.dilation[lead] == 1;
  const int64_t* sk = s.keys.data();
  const int32_t* rows = s.rows.data();
  std::vector<int64_t> cursor(static_cast<size_t>(o.groups));
  for (int64_t gr = 0; gr < o.groups; ++gr)
    cursor[gr] = std::lower_bound(sk, sk + n, add_clamped(sk[p0], o.lead_delta[gr] + o.last_shift[0])) - sk;
  // The block's coordinates in sorted order, gathered up front: independent loads overlap their misses.
  std::vector<int32_t> coords(static_cast<size_t>((p1 - p0) * nd));
  for (int64_t p = p0; p < p1; ++p) {
    const int32_t* c = indices + static_cast<int64_t>(rows[p]) * (1 + nd) + 1;
    std::copy(c, c + nd, coords.data() + (p - p0) * nd);
  }
  std::vector<uint8_t> last_inside(static_cast<size_t>(klast + 1), 0);  // [klast]: the junk entry, never inside
  std::vector<int32_t> row_out(static_cast<size_t>(kvol + 1));          // one row's entries, plus junk
  for (int64_t p = p0; p < p1; ++p) {
    // The table rows are written in sorted order, scattered over the table: request them for writing a few
    // rows ahead.
    if (p + kWriteAhead < p1) {  // every cache line the row touches (rows don't start on a line)
      const auto row = reinterpret_cast<uintptr_t>(out + static_cast<int64_t>(rows[p + kWriteAhead]) * kvol);
      const uintptr_t end = row + static_cast<uintptr_t>(kvol) * sizeof(int32_t);
      for (uintptr_t line = row & ~uintptr_t{63}; line < end; line += 64)
        __builtin_prefetch(reinterpret_cast<const void*>(line), 1, 3);
    }
    const int32_t* c = coords.data() + (p - p0) * nd;
    // key + delta can land in another grid line at the border: check each dimension.
    for (int64_t i = 0; i < klast; ++i)
      last_inside[i] = static_cast<uint32_t>(c[lead] + o.last_shift[i]) < static_cast<uint32_t>(g.in_shape[lead]);
    std::fill(row_out.begin(), row_out.end(), -1);
    for (int64_t gr = 0; gr < o.groups; ++gr) {
      const int32_t* sh = o.lead_shift.data() + gr * lead;
      bool inside = true;
      for (int d = 0; d < lead; ++d)
        inside &= static_cast<uint32_t>(c[d] + sh[d]) < static_cast<uint32_t>(g.in_shape[d]);
      if (!inside) continue;
      // The neighbour line's site at c's last coordinate has a valid key; t0 = its key + the smallest shift.
      const int64_t t0 = sk[p] + o.lead_delta[gr] + o.last_shift[0];
      const int64_t j = advance(sk, cursor[gr], t0);
      cursor[gr] = j;
      int32_t* dst = row_out.data() + gr * klast;
      if (consecutive) {
        // The junk entry of this group's window is the next group's first entry: save and restore it.
        const int32_t next = dst[klast];
        match_consecutive(sk, rows, j, t0, klast, last_inside.data(), dst);
        dst[klast] = next;
      } else {
        match_scan(sk, rows, j, t0, o.last_shift, last_inside.data(), dst);
      }
    }
    std::copy(row_out.begin(), row_out.begin() + kvol, out + static_cast<int64_t>(rows[p]) * kvol);
  }
}
}  // namespace

int64_t build_subm_map(const int32_t* indices, int64_t n, const ConvGeometry& g, KernelMap& map) {
  SortedRows s = sort_rows(indices, n, g);
  const int64_t dup = first_repeated_row(s, n);
  if (dup >= 0) return dup;
  const SubmOffsets o = subm_offsets(g);
  // Sentinel padding for the windows read past the last key (advance, match_consecutive).
  const int64_t pad = std::max<int64_t>(kStep, o.klast);
  s.keys.resize(static_cast<size_t>(n + pad), std::numeric_limits<int64_t>::max());
  s.rows.resize(static_cast<size_t>(n + pad), -1);
  map.rows_are_outputs = true;
  map.num_out = n;
  map.table.reset(new int32_t[static_cast<size_t>(n * g.kvol)]);
  int32_t* out = map.table.get();
  for_blocks(num_blocks(n), [&](int64_t b) {
    match_subm_block(indices, g, s, n, o, b * kRowBlock, std::min(n, (b + 1) * kRowBlock), out);
  });
  return -1;
}

namespace {
// The output coordinates one input reaches, per dimension: kernel positions pos[d][0..count[d]) and
// the output coordinate val[d][i] through each. The kernel is separable: an offset reaches an output
// exactly when each of its per-dimension positions does.
struct Reach {
  int count[kMaxDim];
  int32_t step_q[kMaxDim], step_r[kMaxDim];  // dilation / stride and dilation % stride
  int stride_log2[kMaxDim];                    // log2(stride) for a power of two, else -1
  std::vector<int32_t> pos, val;  // [ndim, max ksize]
  int64_t width;
};

// Regular conv, one dimension: the outputs (c + padding - o * dilation) / stride over kernel positions o,
// where that divides exactly and lies in [0, out_shape). One division per dimension: the quotient and
// remainder follow o down by dilation / stride and dilation % stride.
int reach_conv_1d(const ConvGeometry& g, const Reach& rc, int d, int32_t c, int32_t* pos, int32_t* val) {
  const int32_t s = g.stride[d];
  const int32_t dq = rc.step_q[d], dr = rc.step_r[d];
  const int32_t num = c + g.padding[d];  // >= 0: coordinates and padding are
  // num - o * dilation == q * s + r, 0 <= r < s. Strides are mostly 2: a shift, not a division.
  const int sh = rc.stride_log2[d];
  int32_t q = sh >= 0 ? num >> sh : num / s;
  int32_t r = sh >= 0 ? num & (s - 1) : num % s;
  int cnt = 0;
  for (int32_t o = 0; o < g.ksize[d]; ++o) {
    if (q >= 0 && r == 0 && q < g.out_shape[d]) {
      pos[cnt] = o;
      val[cnt] = q;
      ++cnt;
    }
    q -= dq;
    r -= dr;
    if (r < 0) {
      r += s;
      --q;
    }
  }
  return cnt;
}

// Transposed conv, one dimension: the outputs c * stride - padding + o * dilation inside [0, out_shape).
int reach_deconv_1d(const ConvGeometry& g, int d, int32_t c, int32_t* pos, int32_t* val) {
  int cnt = 0;
  for (int32_t o = 0; o < g.ksize[d]; ++o) {
    const int32_t v = c * g.stride[d] - g.padding[d] + o * g.dilation[d];
    if (v < 0 || v >= g.out_shape[d]) continue;
    pos[cnt] = o;
    val[cnt] = v;
    ++cnt;
  }
  return cnt;
}

// Same results as conv_output / deconv_output, one dimension at a time.
void compute_reach(const ConvGeometry& g, const int32_t* c, bool transpose, Reach& r) {
  for (int d = 0; d < g.ndim; ++d) {
    int32_t* pos = r.pos.data() + d * r.width;
    int32_t* val = r.val.data() + d * r.width;
    r.count[d] = transpose ? reach_deconv_1d(g, d, c[d], pos, val) : reach_conv_1d(g, r, d, c[d], pos, val);
  }
}

int64_t reach_size(const Reach& r, int nd) {
  int64_t m = 1;
  for (int d = 0; d < nd; ++d) m *= r.count[d];
  return m;
}

// Calls emit(k, output key) for every offset that reaches an output, k ascending (last dimension fastest).
template <typename Emit>
void for_each_reached(const Reach& r, const ConvGeometry& g, int32_t batch, Emit&& emit) {
  const int nd = g.ndim;
  if (reach_size(r, nd) == 0) return;
  int idx[kMaxDim] = {0, 0, 0, 0};
  while (true) {
    int64_t k = 0;
    int64_t key = batch;
    for (int d = 0; d < nd; ++d) {
      k = k * g.ksize[d] + r.pos[d * r.width + idx[d]];
      key = key * g.out_shape[d] + r.val[d * r.width + idx[d]];
    }
    emit(k, key);
    int d = nd - 1;
    while (d >= 0 && ++idx[d] == r.count[d]) idx[d--] = 0;
    if (d < 0) return;
  }
}

Reach make_reach(const ConvGeometry& g) {
  Reach r;
  r.width = *std::max_element(g.ksize, g.ksize + g.ndim);
  r.pos.resize(static_cast<size_t>(g.ndim * r.width));
  r.val.resize(static_cast<size_t>(g.ndim * r.width));
  for (int d = 0; d < g.ndim; ++d) {
    r.step_q[d] = g.dilation[d] / g.stride[d];
    r.step_r[d] = g.dilation[d] % g.stride[d];
    r.stride_log2[d] = std::has_single_bit(static_cast<uint32_t>(g.stride[d])) ? std::countr_zero(static_cast<uint32_t>(g.stride[d])) : -1;
  }
  return r;
}

// Every (input, offset) that reaches an output, in visiting order: inputs by sorted position, then
// offsets ascending. key[j] is the output key of candidate j, slot[j] its table entry (row * kvol + k).
struct Candidates {
  UninitVector<int64_t> key, slot;
};

// Candidates of the inputs at sorted positions [p0, p1), appended to c in visiting order.
void block_candidates(const int32_t* indices, const ConvGeometry& g, bool transpose, const SortedRows& s,
                      int64_t p0, int64_t p1, Candidates& c) {
  const int nd = g.ndim;
  // The block's coordinates in sorted order, gathered up front: independent loads overlap their misses.
  std::vector<int32_t> coords(static_cast<size_t>((p1 - p0) * (1 + nd)));
  for (int64_t p = p0; p < p1; ++p) {
    const int32_t* row = indices + static_cast<int64_t>(s.rows[p]) * (1 + nd);
    for (int d = 0; d <= nd; ++d) coords[(p - p0) * (1 + nd) + d] = row[d];
  }
  Reach r = make_reach(g);
  c.key.reserve(static_cast<size_t>(p1 - p0));
  c.slot.reserve(static_cast<size_t>(p1 - p0));
  for (int64_t p = p0; p < p1; ++p) {
    const int32_t* row = coords.data() + (p - p0) * (1 + nd);
    compute_reach(g, row + 1, transpose, r);
    const int64_t base = static_cast<int64_t>(s.rows[p]) * g.kvol;
    for_each_reached(r, g, row[0], [&](int64_t k, int64_t key) {
      c.key.push_back(key);
      c.slot.push_back(base + k);
    });
  }
}

Candidates list_candidates(const int32_t* indices, const ConvGeometry& g, bool transpose, const SortedRows& s,
                           int64_t n) {
  const int64_t nb = num_blocks(n);
  std::vector<Candidates> per_block(static_cast<size_t>(nb));
  for_blocks(nb, [&](int64_t b) {
    block_candidates(indices, g, transpose, s, b * kRowBlock, std::min(n, (b + 1) * kRowBlock), per_block[b]);
  });
  // Concatenate the blocks in order.
  std::vector<int64_t> start(static_cast<size_t>(nb + 1), 0);
  for (int64_t b = 0; b < nb; ++b) start[b + 1] = start[b] + static_cast<int64_t>(per_block[b].key.size());
  TORCH_CHECK_VALUE(start[nb] <= std::numeric_limits<int32_t>::max(), "kernel map: ", start[nb],
                    " (input, offset) pairs reach an output, more than 2^31 - 1");
  Candidates cand;
  cand.key.resize(static_cast<size_t>(start[nb]));
  cand.slot.resize(static_cast<size_t>(start[nb]));
  for_blocks(nb, [&](int64_t b) {
    std::copy(per_block[b].key.begin(), per_block[b].key.end(), cand.key.begin() + start[b]);
    std::copy(per_block[b].slot.begin(), per_block[b].slot.end(), cand.slot.begin() + start[b]);
  });
  return cand;
}

// Candidates per task of the numbering passes (below it they run on the calling thread). Every pass writes
// what it would write serially, so the task split never changes the result.
constexpr int64_t kNumberGrain = 1 << 16;

// Output ids in first-seen order: the output of candidate group G gets the number of groups whose first
// candidate comes before G's. Writes each candidate's id into the table and each output's key.
void number_outputs(const Candidates& cand, int32_t* table, UninitVector<int64_t>& out_keys) {
  const int64_t m = static_cast<int64_t>(cand.key.size());
  UninitVector<int64_t> sk;
  UninitVector<int32_t> sj;
  sort_key_index(cand.key.data(), m, sk, sj);  // candidates of one output together, ascending j
  auto is_first = [&](int64_t s) { return s == 0 || sk[s] != sk[s - 1]; };
  UninitVector<int32_t> id(static_cast<size_t>(m));  // sj is a permutation: the pass below writes every entry
  at::parallel_for(0, m, kNumberGrain, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) id[sj[s]] = is_first(s);  // 1 at each group's first j
  });
  // Exclusive prefix sum of id over j, by chunks: each chunk's total, the chunk starts, then each chunk's sums.
  const int64_t chunks = (m + kNumberGrain - 1) / kNumberGrain;
  std::vector<int32_t> chunk_start(static_cast<size_t>(chunks + 1), 0);
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int32_t t = 0;
      for (int64_t j = c * kNumberGrain, e = std::min(m, j + kNumberGrain); j < e; ++j) t += id[j];
      chunk_start[c + 1] = t;
    }
  });
  for (int64_t c = 0; c < chunks; ++c) chunk_start[c + 1] += chunk_start[c];
  at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      int32_t next = chunk_start[c];
      for (int64_t j = c * kNumberGrain, e = std::min(m, j + kNumberGrain); j < e; ++j) {
        const int32_t first = id[j];
        id[j] = next;
        next += first;
      }
    }
  });
  out_keys.resize(static_cast<size_t>(chunk_start[chunks]));
  at::parallel_for(0, m, kNumberGrain, [&](int64_t b, int64_t e) {
    int64_t r = b;  // the group of the range's first candidate: its first candidate's id
    while (!is_first(r)) --r;
    int32_t group = id[sj[r]];
    for (int64_t s = b; s < e; ++s) {
      if (is_first(s)) {
        group = id[sj[s]];
        out_keys[group] = sk[s];
      }
      table[cand.slot[sj[s]]] = group;
    }
  });
}

void decode_keys(const UninitVector<int64_t>& keys, const ConvGeometry& g, int32_t* out) {
  const int nd = g.ndim;
  const int64_t stride = 1 + nd;
  at::parallel_for(0, static_cast<int64_t>(keys.size()), 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      int64_t key = keys[r];
      for (int d = nd - 1; d >= 0; --d) {
        out[r * stride + 1 + d] = static_cast<int32_t>(key % g.out_shape[d]);
        key /= g.out_shape[d];
      }
      out[r * stride] = static_cast<int32_t>(key);
    }
  });
}
}  // namespace

void build_conv_map(const int32_t* indices, int64_t n, const ConvGeometry& g, bool transpose, KernelMap& map) {
  const int64_t kvol = g.kvol;
  // Inputs are visited in key order, offsets ascending; outputs are numbered in first-seen order.
  const SortedRows s = sort_rows(indices, n, g);
  const Candidates cand = list_candidates(indices, g, transpose, s, n);
  map.rows_are_outputs = false;
  map.repeat_free = first_repeated_row(s, n) < 0;
  map.table.reset(new int32_t[static_cast<size_t>(n * kvol)]);
  int32_t* table = map.table.get();
  // In parallel from 512k entries: a 10k-voxel strided conv's table (270k) stays on the calling thread.
  at::parallel_for(0, n * kvol, 1 << 19, [&](int64_t b, int64_t e) { std::fill(table + b, table + e, -1); });
  UninitVector<int64_t> out_keys;  // every output's key is written by its first candidate
  number_outputs(cand, table, out_keys);
  map.num_out = static_cast<int64_t>(out_keys.size());
  map.out_indices.resize(out_keys.size() * (1 + g.ndim));
  decode_keys(out_keys, g, map.out_indices.data());
}

namespace {
// Pairs of the rows [r0, r1) at each offset k, counted into c[k].
void count_block(const int32_t* table, int64_t r0, int64_t r1, int64_t kvol, int64_t* c) {
  std::vector<int32_t> local(static_cast<size_t>(kvol), 0);  // int32: a block has fewer than 2^31 pairs
  int32_t* lc = local.data();
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* t = table + r * kvol;
    for (int64_t k = 0; k < kvol; ++k) lc[k] += t[k] >= 0;
  }
  for (int64_t k = 0; k < kvol; ++k) c[k] = lc[k];
}

// Writes the pairs of the rows [r0, r1), offset by offset, from pos[k] on. Each offset's run is first
// collected in a buffer that every entry writes (a missing one is overwritten by the next): no branch
// on the sparse table, and no write past the run, which belongs to another block.
void compact_block(const int32_t* table, int64_t r0, int64_t r1, int64_t kvol, const int64_t* pos,
                   int32_t* rows_dst, int32_t* partner_dst, std::vector<int32_t>& buf) {
  buf.resize(static_cast<size_t>(2 * (r1 - r0 + 1)));
  int32_t* rows_buf = buf.data();
  int32_t* partner_buf = buf.data() + (r1 - r0 + 1);
  for (int64_t k = 0; k < kvol; ++k) {
    int64_t c = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int32_t p = table[r * kvol + k];
      rows_buf[c] = static_cast<int32_t>(r);
      partner_buf[c] = p;
      c += p >= 0;
    }
    std::copy(rows_buf, rows_buf + c, rows_dst + pos[k]);
    std::copy(partner_buf, partner_buf + c, partner_dst + pos[k]);
  }
}
}  // namespace

std::vector<int64_t> count_pairs(const KernelMap& map, int64_t num_rows, int64_t kvol, int64_t* pair_offsets) {
  const int64_t nb = num_blocks(num_rows);
  std::vector<int64_t> counts(static_cast<size_t>(nb * kvol), 0);
  for_blocks(nb, [&](int64_t b) {
    count_block(map.table.get(), b * kRowBlock, std::min(num_rows, (b + 1) * kRowBlock), kvol,
                counts.data() + b * kvol);
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
  for_blocks(nb, [&](int64_t b) {
    std::vector<int32_t> buf;
    compact_block(map.table.get(), b * kRowBlock, std::min(num_rows, (b + 1) * kRowBlock), kvol,
                  start.data() + b * kvol, rows_dst, partner_dst, buf);
  });
}

}  // namespace native
}  // namespace spconv
