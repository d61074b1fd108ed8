// The one schema file: every operator of the spconv namespace is declared here.
// Implementations live in csrc/ops/cpu (native route) and csrc/ops/gpu (HIP/CUDA glue);
// fake (meta) kernels for torch.compile live beside the Python wrappers in spconv/pytorch/ops.py.
#include <torch/library.h>

#include "build_info.h"

TORCH_LIBRARY(spconv, m) {
  m.def("build_info() -> str", &spconv::build_info_json);

  // ---- kernel maps ----
  // Pairs grouped by kernel offset: pair_in[p] feeds pair_out[p] through the offset k with
  // pair_offsets[k] <= p < pair_offsets[k + 1]. out_indices is the input for subm.
  m.def(
      "get_indice_pairs(Tensor indices, int batch_size, int[] spatial_shape, int[] out_shape, int[] ksize, "
      "int[] stride, int[] padding, int[] dilation, bool subm, bool transpose) "
      "-> (Tensor out_indices, Tensor pair_in, Tensor pair_out, Tensor pair_offsets)");

  // ---- native route: gather -> GEMM -> scatter; filters [kvol, Cin, Cout] ----
  m.def(
      "indice_conv(Tensor features, Tensor filters, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, "
      "SymInt num_out) -> Tensor");
  m.def(
      "indice_conv_backward(Tensor features, Tensor filters, Tensor out_grad, Tensor pair_in, Tensor pair_out, "
      "Tensor pair_offsets) -> (Tensor, Tensor)");

  // ---- pooling, voxelization, hash table (see their sections below) ----
}
