#include "radix_sort.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <bit>
#include <limits>
#include <utility>

namespace spconv {
namespace native {

namespace {
// Below this a sort runs on one thread: each parallel region costs a wake-up of the other threads, which
// on a busy machine can be a scheduler tick, more than a pass over this many words takes. (The maps of the
// benchmark's 10k-voxel layers sort on one thread; the 125k-voxel scan's rows in parallel.)
constexpr int64_t kParallelMin = 1 << 16;
// Words per chunk of a parallel pass, at least: a chunk's histogram (2^kMaxDigit counts) is small beside it.
constexpr int64_t kMinChunkWords = 1 << 14;
// Grain of the element-wise loops (packing, unpacking).
constexpr int64_t kGrain = 1 << 16;
// Digits of at most 11 bits keep the per-chunk histograms small enough for L1/L2.
constexpr int kMaxDigit = 11;

int bit_width(uint64_t v) { return static_cast<int>(std::bit_width(v)); }

int64_t chunk_begin(int64_t c, int64_t chunks, int64_t n) { return n * c / chunks; }

// Chunks of a counting pass, one per thread. A stable sort has one result, so the chunking (and with it the
// thread count) never changes the bits; chunks fixed in number would cap the threads a pass can use.
int64_t pass_chunks(int64_t n) {
  if (n < kParallelMin) return 1;
  return std::clamp<int64_t>(n / kMinChunkWords, 1, at::get_num_threads());
}

// One counting-sort pass on the digit (w >> shift) & mask, src -> dst. Returns false (dst untouched)
// when every word has the same digit: the pass would not move anything.
bool radix_pass(const uint64_t* src, uint64_t* dst, int64_t n, int shift, int width) {
  const int64_t chunks = pass_chunks(n);
  const int64_t buckets = int64_t{1} << width;
  const uint64_t mask = static_cast<uint64_t>(buckets - 1);
  std::vector<int64_t> hist(static_cast<size_t>(chunks * buckets), 0);
  auto count = [&](int64_t c) {
    int64_t* h = hist.data() + c * buckets;
    for (int64_t i = chunk_begin(c, chunks, n), e = chunk_begin(c + 1, chunks, n); i < e; ++i)
      ++h[(src[i] >> shift) & mask];
  };
  auto scatter = [&](int64_t c) {
    int64_t* pos = hist.data() + c * buckets;
    for (int64_t i = chunk_begin(c, chunks, n), e = chunk_begin(c + 1, chunks, n); i < e; ++i)
      dst[pos[(src[i] >> shift) & mask]++] = src[i];
  };
  auto for_chunks = [&](auto&& f) {
    if (chunks == 1) return f(0);
    at::parallel_for(0, chunks, 1, [&](int64_t c0, int64_t c1) {
      for (int64_t c = c0; c < c1; ++c) f(c);
    });
  };
  for_chunks(count);
  // Turn the counts into start positions: bucket-major, chunk-minor keeps the pass stable.
  int64_t pos = 0;
  for (int64_t b = 0; b < buckets; ++b) {
    const int64_t first = pos;
    for (int64_t c = 0; c < chunks; ++c) {
      int64_t& h = hist[c * buckets + b];
      const int64_t cnt = h;
      h = pos;
      pos += cnt;
    }
    if (pos - first == n) return false;
  }
  for_chunks(scatter);
  return true;
}

// Comparison-sort fallback for keys too wide to share a 64-bit word with the index.
void sort_pairs(const int64_t* keys, int64_t m, UninitVector<int64_t>& sorted_keys, UninitVector<int32_t>& index) {
  std::vector<std::pair<int64_t, int32_t>> kv(static_cast<size_t>(m));
  for (int64_t i = 0; i < m; ++i) kv[i] = {keys[i], static_cast<int32_t>(i)};
  std::sort(kv.begin(), kv.end());
  for (int64_t s = 0; s < m; ++s) {
    sorted_keys[s] = kv[s].first;
    index[s] = kv[s].second;
  }
}

// words[i] = key << index_bits | i (unsigned: a key too wide for the word wraps harmlessly), and the
// largest key, which tells whether it was wide.
int64_t pack_words(const int64_t* keys, int64_t m, int index_bits, UninitVector<uint64_t>& words) {
  words.resize(static_cast<size_t>(m));
  return at::parallel_reduce(
      0, m, kGrain, int64_t{0},
      [&](int64_t b, int64_t e, int64_t acc) {
        for (int64_t i = b; i < e; ++i) {
          words[i] = (static_cast<uint64_t>(keys[i]) << index_bits) | static_cast<uint64_t>(i);
          acc = std::max(acc, keys[i]);
        }
        return acc;
      },
      [](int64_t a, int64_t b) { return std::max(a, b); });
}
}  // namespace

void radix_sort_bits(UninitVector<uint64_t>& words, int lo, int hi) {
  const int64_t n = static_cast<int64_t>(words.size());
  const int bits = hi - lo;
  if (bits <= 0 || n < 2) return;
  const int passes = (bits + kMaxDigit - 1) / kMaxDigit;
  const int digit = (bits + passes - 1) / passes;
  UninitVector<uint64_t> tmp(static_cast<size_t>(n));  // written whole by each pass's scatter
  for (int shift = lo; shift < hi; shift += digit) {
    if (radix_pass(words.data(), tmp.data(), n, shift, std::min(digit, hi - shift))) words.swap(tmp);
  }
}

void sort_key_index(const int64_t* keys, int64_t m, UninitVector<int64_t>& sorted_keys, UninitVector<int32_t>& index) {
  sorted_keys.resize(static_cast<size_t>(m) + 1);
  index.resize(static_cast<size_t>(m));
  sorted_keys[m] = std::numeric_limits<int64_t>::max();
  if (m == 0) return;
  const int index_bits = bit_width(static_cast<uint64_t>(m - 1));
  // Words start in index order, so a stable sort on the key bits alone breaks ties by index.
  UninitVector<uint64_t> words;
  const int key_bits = bit_width(static_cast<uint64_t>(pack_words(keys, m, index_bits, words)));
  if (index_bits + key_bits > 64) return sort_pairs(keys, m, sorted_keys, index);
  radix_sort_bits(words, index_bits, index_bits + key_bits);
  const uint64_t index_mask = (uint64_t{1} << index_bits) - 1;
  at::parallel_for(0, m, kGrain, [&](int64_t b, int64_t e) {
    for (int64_t s = b; s < e; ++s) {
      sorted_keys[s] = static_cast<int64_t>(words[s] >> index_bits);
      index[s] = static_cast<int32_t>(words[s] & index_mask);
    }
  });
}

}  // namespace native
}  // namespace spconv
