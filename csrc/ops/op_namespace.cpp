#include "op_namespace.h"

// Normal builds register into spconv whatever is defined; the HIP CPU test build takes its variant's namespace
// from the build tool (tools/hip_cpu_build.py), spconv_hipcpu when none is given.
#if !defined(SPCONV_HIP_CPU)
#undef SPCONV_OP_NAMESPACE
#define SPCONV_OP_NAMESPACE spconv
#elif !defined(SPCONV_OP_NAMESPACE)
#define SPCONV_OP_NAMESPACE spconv_hipcpu
#endif

#define SPCONV_STRINGIZE_(x) #x
#define SPCONV_STRINGIZE(x) SPCONV_STRINGIZE_(x)

namespace spconv {
namespace ops {

const char* op_namespace() { return SPCONV_STRINGIZE(SPCONV_OP_NAMESPACE); }
const char* debug_op_namespace() { return SPCONV_STRINGIZE(SPCONV_OP_NAMESPACE) "_debug"; }

}  // namespace ops
}  // namespace spconv
