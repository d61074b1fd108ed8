#include "build_info.h"

#include <sstream>

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
#ifdef _OPENMP
    << ", \"openmp\": " << _OPENMP
#endif
    << "}";
  return s.str();
}

}  // namespace spconv
