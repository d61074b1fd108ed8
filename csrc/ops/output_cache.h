// Op outputs of 128 KB and more on the CPU come from a small cache of freed output blocks.
//
// Why: torch's CPU allocator hands each large tensor fresh pages from the OS (and returns them on free), so
// every call of a layer faults in and zeroes its whole output again, and with transparent huge pages the kernel
// may compact memory on the fault (docs/routes.md, "CPU memory", has the figures). A layer run again (the next
// batch, the next iteration, the backward of the same shapes) writes into memory that is already mapped.
// Outputs of a few hundred kilobytes too: the filters every conv call transposes its weight into (0.1-7 MB).
//
// What it keeps: blocks of at least kMinCachedBytes, sized in 64 KB steps under 2 MB and in 2 MB steps (advised
// for huge pages) above, up to SPCONV_CPU_OUTPUT_CACHE_MB megabytes in all (default 512; 0 turns the cache off);
// the oldest go back to the OS first. A request takes the smallest cached block that holds it with at most a
// quarter to spare. Outputs are ordinary CPU tensors (resizable, shareable); only the memory under them is
// recycled.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
#include <vector>

namespace spconv {
namespace ops {

// Smaller outputs take at::empty: malloc's own free lists recycle them.
constexpr int64_t kMinCachedBytes = int64_t{128} << 10;

at::Tensor empty_output(at::IntArrayRef sizes, const at::TensorOptions& options);
at::Tensor zeros_output(at::IntArrayRef sizes, const at::TensorOptions& options);

// [cached bytes, cached blocks, hits, misses, capacity bytes] (the cpu_output_cache_info op).
std::vector<int64_t> output_cache_info();
// Returns every cached block to the OS (cpu_output_cache_clear); blocks in use are kept by their tensors.
void output_cache_clear();

}  // namespace ops
}  // namespace spconv
