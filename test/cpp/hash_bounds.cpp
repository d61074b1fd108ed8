// The kernel-map hash table on the HIP CPU runtime: the map builder's insert kernel reports a full table instead
// of probing forever, and looking up an absent key in a full table ends. Prints "ok" on success.
#include "hip/kernel_map.cu"
#include "hip/launch_ledger.cu"  // every launch notes itself in the test build's ledger

#include <cstdio>
#include <numeric>
#include <vector>

namespace {

using namespace spconv;
using namespace spconv::gpu;

__global__ void find_kernel(const int64_t* hkeys, int64_t cap, int64_t key, int64_t* out) {
  if (blockIdx.x == 0 && threadIdx.x == 0) *out = hash_find(hkeys, cap, key);
}

// A 1-D map with a 1-wide kernel: every input is its own output, so `n` inputs put n keys in the table.
// Returns the status' full flag (-1 when a launch failed).
int64_t insert_into_table_of(int64_t n, int64_t cap, std::vector<int64_t>& hkeys) {
  ConvGeometry g{};
  g.ndim = 1;
  g.kvol = 1;
  g.in_shape[0] = g.out_shape[0] = 1000;
  g.ksize[0] = g.stride[0] = g.dilation[0] = 1;
  g.padding[0] = 0;
  std::vector<int32_t> indices(2 * n);
  for (int64_t i = 0; i < n; ++i) {
    indices[2 * i] = 0;
    indices[2 * i + 1] = static_cast<int32_t>(7 * i);
  }
  std::vector<int64_t> in_keys(n), slot(n), flags(2 * n), status(kMapCounts + 1), offsets(2), order(n);
  std::vector<unsigned long long> hvisit(cap);
  hkeys.assign(cap, 0);
  const ConvMapBuffers b{in_keys.data(), hkeys.data(), hvisit.data(), cap, slot.data(), flags.data(), status.data(),
                         offsets.data()};
  if (conv_map_init(indices.data(), n, g, 1, b, nullptr) != 0) return -1;
  std::iota(order.begin(), order.end(), 0);  // the keys 7 * i ascend with the row already
  if (conv_map_insert(indices.data(), in_keys.data(), order.data(), n, g, false, b, nullptr) != 0) return -1;
  return status[kMapFull];
}

}  // namespace

int main() {
  const int64_t cap = 16;
  std::vector<int64_t> hkeys;
  if (insert_into_table_of(cap, cap, hkeys) != 0) {
    std::printf("full after %d keys\n", int(cap));
    return 4;
  }
  if (insert_into_table_of(cap + 1, cap, hkeys) != 1) {
    std::printf("a key past the capacity was not reported\n");
    return 6;
  }
  int64_t found = 0;
  launch_kernel(find_kernel, 1, 1, 0, nullptr, hkeys.data(), cap, int64_t{5}, &found);
  if (last_launch_error() != 0) return 7;
  if (found != -1) {
    std::printf("absent key found in slot %d\n", int(found));
    return 8;
  }
  std::printf("ok\n");
  return 0;
}
