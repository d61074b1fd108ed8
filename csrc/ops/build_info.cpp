#include "build_info.h"

#include <sstream>

#include "../native/int8_conv.h"
#include "../native/simd.h"

#include "../../spconv/include/spconv/ops.h"  // the public header ships inside the Python package

// setup.py defines these; the defaults keep a hand build honest.
#ifndef SPCONV_GPU_BACKEND
#define SPCONV_GPU_BACKEND "none"
#endif
#ifndef SPCONV_GPU_ARCHS
#define SPCONV_GPU_ARCHS ""
#endif
#ifndef SPCONV_TORCH_VERSION
#define SPCONV_TORCH_VERSION "unknown"
#endif

namespace spconv {

std::string build_info_json() {
  std::ostringstream s;
  s << "{\"backends\": [\"cpu\"" << (std::string(SPCONV_GPU_BACKEND) == "none" ? "" : ", \"" SPCONV_GPU_BACKEND "\"")
    << "], \"gpu_backend\": \"" SPCONV_GPU_BACKEND "\", \"gpu_archs\": \"" SPCONV_GPU_ARCHS "\""
    << ", \"compiler\": \"" << __VERSION__ << "\""
    << ", \"torch_version\": \"" SPCONV_TORCH_VERSION "\""
    << ", \"cpu_isa\": \"" << native::cpu_isa_name() << "\""  // what the CPU kernels pick on this machine
    << ", \"int8_cpu_path\": \"" << native::int8_path_name(native::int8_conv_path()) << "\""  // quantized_conv's
#ifdef _OPENMP
    << ", \"openmp\": " << _OPENMP
#endif
    << "}";
  return s.str();
}

}  // namespace spconv

// The C entry point of spconv/include/spconv/ops.h (a stable name for C++ programs).
extern "C" SPCONV_API const char* spconv_build_info(void) {
  static const std::string info = spconv::build_info_json();
  return info.c_str();
}
