#include "fma_peak_op.h"

#include <c10/util/Exception.h>

#include "../../native/fma_peak.h"

namespace spconv {
namespace ops {

int64_t cpu_fma_peak_loop(int64_t iters, c10::ScalarType dtype) {
  TORCH_CHECK_VALUE(iters >= 1, "cpu_fma_peak_loop: iters must be at least 1, got ", iters);
  TORCH_CHECK_VALUE(dtype == c10::kFloat || dtype == c10::kDouble,
                    "cpu_fma_peak_loop: dtype must be torch.float32 or torch.float64, got ", dtype);
  return native::fma_peak_loop(iters, dtype == c10::kDouble);
}

}  // namespace ops
}  // namespace spconv
