#pragma once
#include <cstdint>
#include <vector>

namespace spconv {
namespace ops {
// cpu_parallel_region_info: how the native route's parallel regions ran (native/region_stalls.h).
std::vector<int64_t> cpu_parallel_region_info();
// cpu_parallel_region_set_budget: the serial budget as if a region had just waited ns (0 forgets the waits).
void cpu_parallel_region_set_budget(int64_t ns);
}  // namespace ops
}  // namespace spconv
