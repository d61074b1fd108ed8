// The op namespace this library registers into: "spconv", or in the HIP CPU test build the variant's own
// namespace. Only op_namespace.cpp sees the name (SPCONV_OP_NAMESPACE), so the schema and the GPU glue compile
// to the same objects for every variant of the test build.
#pragma once

namespace spconv {
namespace ops {

const char* op_namespace();
// The diagnostics' namespace: op_namespace() followed by "_debug".
const char* debug_op_namespace();

}  // namespace ops
}  // namespace spconv
