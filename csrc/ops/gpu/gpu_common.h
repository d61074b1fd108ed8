// Helpers of the GPU glue (compiled by the host C++ compiler: no GPU headers, only ATen and c10).
#pragma once
#include <ATen/ATen.h>
#include <c10/core/DeviceGuard.h>
#include <c10/core/impl/DeviceGuardImplInterface.h>

#include "../../hip/launchers.h"
#include "../checks.h"

namespace spconv {
namespace ops {

// The current stream of `device` (CUDA or ROCm masquerading as CUDA) as the runtime's native handle.
// The HIP CPU test build runs on CPU tensors: its runtime's null stream.
inline void* current_stream(const at::Device& device) {
#if defined(SPCONV_HIP_CPU)
  (void)device;
  return nullptr;
#else
  return c10::impl::getDeviceGuardImpl(device.type())->getStream(device).native_handle();
#endif
}

inline gpu::DType gpu_dtype(at::ScalarType t) {
  switch (t) {
    case at::kFloat: return gpu::DType::F32;
    case at::kHalf: return gpu::DType::F16;
    case at::kBFloat16: return gpu::DType::BF16;
    case at::kDouble: return gpu::DType::F64;
    default: TORCH_CHECK_TYPE(false, "unsupported dtype for a GPU kernel: ", t);
  }
  return gpu::DType::F32;
}

// Every launcher call goes through this: a failed launch raises with the kernel's name and the runtime's message.
inline void check_launch(int code, const char* what) {
  TORCH_CHECK(code == 0, "spconv GPU kernel ", what, " failed: ", gpu::error_string(code));
}

}  // namespace ops
}  // namespace spconv
