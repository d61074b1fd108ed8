// The kernel-map hash table on the HIP CPU runtime: inserting into a full table reports it instead of probing
// forever, and looking up an absent key in a full table ends. Prints "ok" on success.
#include "hip/kernel_map.cu"
#include "hip/launch_ledger.cu"  // every launch notes itself in the test build's ledger

#include <cstdio>
#include <vector>

int main() {
  using namespace spconv::gpu;
  const int64_t cap = 16;
  std::vector<int64_t> hkeys(cap), keys(cap + 1);
  std::vector<int32_t> hvals(cap), out(1);
  for (int64_t i = 0; i <= cap; ++i) keys[i] = 1000 + 7 * i;
  int32_t full = 0;
  if (hash_clear(hkeys.data(), hvals.data(), cap, nullptr) != 0) return 2;
  if (hash_insert_keys(keys.data(), cap, hkeys.data(), cap, &full, nullptr) != 0) return 3;
  if (full != 0) { std::printf("full after %d keys\n", int(cap)); return 4; }
  if (hash_insert_keys(keys.data() + cap, 1, hkeys.data(), cap, &full, nullptr) != 0) return 5;
  if (full != 1) { std::printf("a key past the capacity was not reported\n"); return 6; }
  const int64_t absent = 5;
  if (hash_lookup(&absent, 1, hkeys.data(), hvals.data(), cap, out.data(), nullptr) != 0) return 7;
  if (out[0] != -1) { std::printf("absent key found: %d\n", out[0]); return 8; }
  std::printf("ok\n");
  return 0;
}
