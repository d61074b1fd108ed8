#include "parallel_region_op.h"

#include <c10/util/Exception.h>

#include "../../native/region_stalls.h"

namespace spconv {
namespace ops {

std::vector<int64_t> cpu_parallel_region_info() { return native::parallel_region_info(); }

void cpu_parallel_region_set_budget(int64_t ns) {
  TORCH_CHECK_VALUE(ns >= 0, "cpu_parallel_region_set_budget: ns must be >= 0, got ", ns);
  native::set_serial_budget_ns(ns);
}

}  // namespace ops
}  // namespace spconv
