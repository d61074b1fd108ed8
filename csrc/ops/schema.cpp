// The one schema file of the user's operators: every operator of the spconv namespace is declared here
// (op_library.h says which namespace a build registers: spconv, or its own one in the HIP CPU test build); the
// diagnostics live in debug_schema.cpp.
// Implementations live in csrc/ops/cpu (native route) and csrc/ops/gpu (HIP/CUDA glue);
// fake (meta) kernels for torch.compile live beside the Python wrappers in spconv/pytorch/ops.py.
#include <torch/library.h>

#include "build_info.h"
#include "checks.h"
#include "op_library.h"
#include "output_cache.h"

SPCONV_SCHEMA(m) {
  m.def("build_info() -> str", &spconv::build_info_json);
  // Handing the blocks of the cache of large CPU op outputs (output_cache.h) back to the OS.
  m.def("cpu_output_cache_clear() -> ()", &spconv::ops::output_cache_clear);

  // ---- kernel maps ----
  // Pairs grouped by kernel offset: pair_in[p] feeds pair_out[p] through the offset k with
  // pair_offsets[k] <= p < pair_offsets[k + 1]. out_indices is the input for subm.
  // map_info (int64 [kvol + 4], always on the CPU): pair_offsets, the input and output row counts the pairs
  // index below, and 1 when no row repeats within an offset (no duplicate input coordinates; 0: unknown).
  // The ops below take it as their optional last argument: given it, they check the map on the host and copy
  // nothing from the device (csrc/ops/checks.h). A GPU map costs one device->host copy, when it is built.
  // table [N, kvol] int32: the builder's neighbour table the pairs were compacted from (-1 = none). Subm: row o,
  // offset k holds the input feeding output o (the fused route's forward table). Regular/transposed: row i holds
  // the output input i feeds (the fused table of the reversed map: dinput, inverse conv).
  m.def(
      "get_indice_pairs(Tensor indices, int batch_size, int[] spatial_shape, int[] out_shape, int[] ksize, "
      "int[] stride, int[] padding, int[] dilation, bool subm, bool transpose) "
      "-> (Tensor out_indices, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, Tensor map_info, Tensor table)");
  // The GPU's submanifold map without a host read (GPU glue only): the out->in table nbr [N, kvol] int32,
  // build_fused_map's masks and order of it for num_splits > 0 ([num_splits, N]; [0, N] for 0), pair_offsets
  // [kvol + 1] on the device, and status (int32 [4]: the device's checks of the indices). subm_map_pairs makes
  // the pairs and map_info from them with one device->host copy, raising what get_indice_pairs raises for bad
  // indices; its arguments must be subm_kernel_map's (the values are trusted, the shapes checked).
  // The GPU's regular / transposed / pooling map (GPU glue only): get_indice_pairs' outputs (table: the in->out
  // table [num_in, kvol]) and also the out->in table [num_out, kvol] (the input feeding each output through each
  // offset, -1: none), which the fused forward and the pools read; [0, kvol] where the indices repeat a
  // coordinate.
  m.def(
      "strided_kernel_map(Tensor indices, int batch_size, int[] spatial_shape, int[] out_shape, int[] ksize, "
      "int[] stride, int[] padding, int[] dilation, bool transpose) "
      "-> (Tensor out_indices, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, Tensor map_info, "
      "Tensor in_table, Tensor out_table)");
  m.def(
      "subm_kernel_map(Tensor indices, int batch_size, int[] spatial_shape, int[] ksize, int[] dilation, "
      "int num_splits) -> (Tensor nbr, Tensor masks, Tensor order, Tensor pair_offsets, Tensor status)");
  m.def(
      "subm_map_pairs(Tensor indices, int batch_size, int[] spatial_shape, int[] ksize, int[] dilation, "
      "Tensor nbr, Tensor pair_offsets, Tensor status) -> (Tensor pair_in, Tensor pair_out, Tensor map_info)");

  // ---- native route: gather -> GEMM -> scatter; filters [kvol, Cin, Cout] ----
  // The filters of a weight: spconv's [Cout, *kernel_size, Cin/groups] -> [kvol, groups, Cin/groups,
  // Cout/groups] (one [cig, cog] matrix per offset and group; groups = 1 is [kvol, Cin, Cout]), and the inverse
  // (the filter gradient back in the weight's layout). CPU only: elsewhere the Python wrapper permutes.
  m.def("weight_to_filters(Tensor weight, int groups) -> Tensor");
  m.def("filters_to_weight(Tensor filters, int[] kernel_size) -> Tensor");
  // positions: the GPU route's pair_positions table of the rows a pass writes (the forward's outputs, the
  // backward's inputs), made once per map by the caller; absent, the op makes it (two launches more). The
  // forward's in_positions is only carried to its autograd backward. The CPU route ignores both.
  m.def(
      "indice_conv(Tensor features, Tensor filters, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, "
      "SymInt num_out, Tensor? map_info=None, Tensor? out_positions=None, Tensor? in_positions=None) -> Tensor");
  m.def(
      "indice_conv_backward(Tensor features, Tensor filters, Tensor out_grad, Tensor pair_in, Tensor pair_out, "
      "Tensor pair_offsets, Tensor? map_info=None, Tensor? in_positions=None) -> (Tensor, Tensor)");
  // pos[r, k] = the index within offset k of the pair that writes row r through k (pair_dst[p] == r), else -1:
  // the table by which the native route sums each row's products in offset order.
  m.def("pair_positions(Tensor pair_dst, Tensor pair_offsets, SymInt num_dst) -> Tensor");

  // ---- pooling, voxelization, hash table (see their sections below) ----

  // ---- pooling (section owner: surface) ----
  // Same kernel map as a regular conv. Max pool: outputs start at 0 (spconv's semantics, so the
  // result is max(0, window max)); the backward sends each gradient to the input of the first
  // offset whose value equals the output. Avg pool: mean over the window's active inputs; count is
  // the number of active inputs per output (int32), which the backward divides by.
  m.def("indice_maxpool(Tensor features, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, SymInt num_out, "
        "Tensor? map_info=None) -> Tensor");
  m.def(
      "indice_maxpool_backward(Tensor features, Tensor out_features, Tensor out_grad, Tensor pair_in, "
      "Tensor pair_out, Tensor pair_offsets, Tensor? map_info=None) -> Tensor");
  m.def(
      "indice_avgpool(Tensor features, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, SymInt num_out, "
      "Tensor? map_info=None) -> (Tensor, Tensor)");
  m.def(
      "indice_avgpool_backward(Tensor out_grad, Tensor count, Tensor pair_in, Tensor pair_out, "
      "Tensor pair_offsets, SymInt num_in, Tensor? map_info=None) -> Tensor");
  // Over the kernel map's neighbour tables (GPU glue only): nbr [num_out, kvol] int32, the input feeding output o
  // through offset k (-1: none), and nbr_t [num_in, kvol], the output input i feeds (the reversed table), which
  // only the backward reads: pass [0, kvol] when no gradient is needed. Same results as the ops above, bit for
  // bit: each output (forward) or input (backward) row walks its offsets in ascending order, one launch per op.
  // argmax [num_out, C] (uint8 for kvol < 255 with 255 = none, else int32 with -1 = none; [0, C] without nbr_t
  // rows or for int8 features) holds the offset whose input takes each gradient. map_info (get_indice_pairs') of
  // the map the tables come from bounds their entries on the host (and makes count trusted to be
  // indice_avgpool_table's); without it the ops check the entries with one device->host copy.
  m.def(
      "indice_maxpool_table(Tensor features, Tensor nbr, Tensor nbr_t, Tensor? map_info=None) "
      "-> (Tensor out, Tensor argmax)");
  m.def(
      "indice_maxpool_table_backward(Tensor out_grad, Tensor argmax, Tensor nbr_t, Tensor? map_info=None) "
      "-> Tensor");
  m.def(
      "indice_avgpool_table(Tensor features, Tensor nbr, Tensor nbr_t, Tensor? map_info=None) "
      "-> (Tensor out, Tensor count)");
  m.def(
      "indice_avgpool_table_backward(Tensor out_grad, Tensor count, Tensor nbr_t, Tensor? map_info=None) -> Tensor");
  // The other direction of a neighbour table [rows, kvol]: out [num_rows, kvol] with out[table[r, k], k] = r
  // (-1: none); raises for an entry outside [-1, num_rows) or two rows naming one cell (unless map_info, of the
  // map the table belongs to, says the map repeats no row within an offset).
  m.def("transpose_neighbour_table(Tensor table, SymInt num_rows, Tensor? map_info=None) -> Tensor");
  // ---- end pooling ----

  // ---- fused route (section owner: gpu) ----
  // Output-stationary implicit GEMM over an out->in neighbour table (spconv's MaskImplicitGemm idea).
  // build_fused_map: nbr [num_rows, kvol] int32 with nbr[pair_out[p], k(p)] = pair_in[p] (-1 = none);
  // masks [num_splits, num_rows] int32: for split s (offsets k0 = s*kvol/S <= k < k1 = (s+1)*kvol/S,
  // gs = ceil((k1-k0)/32) offsets per bit) bit (k-k0)/gs is set when nbr[r, k] >= 0; order
  // [num_splits, num_rows] int32: the rows stably sorted by their mask read as unsigned. For dinput
  // pass the pairs swapped (pair_out, pair_in) and num_rows = number of inputs, and filters [kvol, Cout, Cin].
  m.def(
      "build_fused_map(Tensor pair_in, Tensor pair_out, Tensor pair_offsets, SymInt num_rows, int num_splits, "
      "Tensor? map_info=None) -> (Tensor nbr, Tensor masks, Tensor order)");
  // The masks and order of build_fused_map for a neighbour table made elsewhere (get_indice_pairs' table).
  m.def("fused_map_masks(Tensor nbr, int num_splits) -> (Tensor masks, Tensor order)");
  // out[r] = sum_k features[nbr[r, k]] @ filters[k]; float32/float16/bfloat16 with fp32 accumulation.
  // With map_info (of the map the tables were built from) the tables are trusted to be build_fused_map's.
  // tf32 (here and below): float32 may take TF32 operands (the tensor-core body where the GPU has one).
  m.def(
      "fused_conv(Tensor features, Tensor filters, Tensor nbr, Tensor masks, Tensor order, Tensor? map_info=None, "
      "bool tf32=False) -> Tensor");
  // dfilters[k] = sum over the pairs p of offset k of features[pair_in[p]]^T out_grad[pair_out[p]].
  m.def(
      "fused_conv_dfilter(Tensor features, Tensor out_grad, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, "
      "Tensor? map_info=None, bool tf32=False) -> Tensor");
  // The backward of fused_conv on tables, with no device->host copy given map_info (the forward map's record):
  // dx = fused_conv(out_grad, filters transposed, nbr, masks, order), nbr [num_in, kvol] the dinput table
  // (mirrored: the forward table of a mirrored map, one split, offset k reading column kvol - 1 - k);
  // dw[k] = sum of features[i]^T out_grad[o] over the entries of column k of dw_table in row order (rows o,
  // entries i when dw_by_output; rows i, entries o otherwise), split-K by the pair count in pair_offsets: the
  // bits of fused_conv_dfilter on pairs in that order. Outputs not asked for (need_dx, need_dw) are empty.
  m.def(
      "fused_conv_backward(Tensor features, Tensor filters, Tensor out_grad, Tensor nbr, Tensor masks, "
      "Tensor order, bool mirrored, Tensor dw_table, bool dw_by_output, Tensor pair_offsets, bool need_dx, "
      "bool need_dw, Tensor? map_info=None, bool tf32=False) -> (Tensor dx, Tensor dw)");
  // Which kernel body fused_conv runs for this tensor's device and dtype (and tf32): reference, simt, wmma, mfma,
  // sm80 or tf32.
  m.def("fused_conv_path(Tensor features, bool tf32=False) -> str");
  // ---- end fused route ----

  // ---- voxelization and hash table (section owner: voxel) ----
  // Points [N, C] float32/float64 -> voxels in first-point order. vsize, coors_range (lower corner then
  // upper corner) and grid_size are in zyx order; grid dimension j reads point column ndim - 1 - j.
  // voxels [M, max_num_points_per_voxel, C] (points' dtype, padding zero or the voxel's mean),
  // indices [M, ndim] int32 zyx, num_per_voxel [M] int32, pc_voxel_id [N] int64 (-1 = dropped).
  m.def(
      "point_to_voxel(Tensor points, float[] vsize, float[] coors_range, int[] grid_size, int max_num_voxels, "
      "int max_num_points_per_voxel, bool empty_mean) "
      "-> (Tensor voxels, Tensor indices, Tensor num_per_voxel, Tensor pc_voxel_id)");
  // Open-addressing table in two flat tensors (empty slot: key = largest value of the key dtype).
  // insert: present keys keep their value, repeated keys take their first occurrence's, values=None -> 0.
  m.def("hash_table_insert(Tensor(a!) table_keys, Tensor(b!) table_values, Tensor keys, Tensor? values) -> ()");
  // values of absent keys are 0; is_empty uint8 marks them.
  m.def("hash_table_query(Tensor table_keys, Tensor table_values, Tensor keys) -> (Tensor values, Tensor is_empty)");
  // Overwrites the values of present keys (first occurrence wins); returns is_empty (uint8) for absent ones.
  m.def(
      "hash_table_insert_exist_keys(Tensor table_keys, Tensor(a!) table_values, Tensor keys, Tensor values) "
      "-> Tensor is_empty");
  // ---- end voxelization and hash table ----

  // ---- grouped and depthwise convolution (section owner: groups) ----
  // filters [kvol, G, Cin/G, Cout/G]: offset k, group g maps input channels [g*Cin/G, (g+1)*Cin/G) to output
  // channels [g*Cout/G, (g+1)*Cout/G) (conv.py converts the [Cout, *kernel, Cin/G] weight). Each output row
  // sums its pairs in kernel-offset order and is written once: deterministic, no atomics. FP16/BF16 accumulate
  // in FP32, FP64 in FP64.
  // Over neighbour tables (build_fused_map's nbr, cached per kernel map): nbr [num_out, kvol] (input row or -1)
  // and its reverse nbr_t [num_in, kvol] (output row or -1), which only the backward reads (pass [0, kvol] when
  // no gradient is needed). out [num_out, Cout]. map_info (get_indice_pairs') of the map the tables were built
  // from bounds their entries on the host (nbr: its input rows, nbr_t: its output rows).
  m.def(
      "grouped_conv(Tensor features, Tensor filters, Tensor nbr, Tensor nbr_t, Tensor? map_info=None) -> Tensor");
  // (d features, d filters) in one pass over the input rows of nbr_t.
  m.def(
      "grouped_conv_backward(Tensor features, Tensor filters, Tensor out_grad, Tensor nbr_t, "
      "Tensor? map_info=None) -> (Tensor, Tensor)");
  // The same convolution over the kernel map's pairs (no table; the native GPU route, maps with repeats).
  m.def(
      "indice_conv_grouped(Tensor features, Tensor filters, Tensor pair_in, Tensor pair_out, Tensor pair_offsets, "
      "SymInt num_out, Tensor? map_info=None) -> Tensor");
  m.def(
      "indice_conv_grouped_backward(Tensor features, Tensor filters, Tensor out_grad, Tensor pair_in, "
      "Tensor pair_out, Tensor pair_offsets, Tensor? map_info=None) -> (Tensor, Tensor)");
  // ---- end grouped convolution ----

  // ---- int8 inference (section owner: quantization) ----
  // Symmetric int8 convolution (every zero point 0), output-stationary over a neighbour table; one pass, int8 in
  // and int8 out. features int8 [num_in, Cin]; filters int8 [kvol, Cin, Cout] (the native route's layout);
  // nbr int32 [num_out, T], T a positive multiple of kvol: column j holds the input row feeding the output row
  // through filters[j % kvol] (-1: none). T > kvol only for maps that repeat a row within an offset (duplicate
  // coordinates): one block of kvol columns per round. The integer sum is exact:
  //   acc[o, c] = sum_j sum_i features[nbr[o, j], i] * filters[j % kvol, i, c]   (int32; the glue refuses T * Cin >= 2^17)
  // then the epilogue in FP32, each operation rounded on its own (never contracted into an FMA):
  //   v = float(acc) * scale[c];  v = v + bias[c] (bias given);  v = v + float(residual[o, c]) * residual_scale
  //   (residual given; the product rounded, then the sum);  activation 0: none, 1: ReLU v = max(v, 0),
  //   2: LeakyReLU v = v < 0 ? v * alpha : v;  out[o, c] = clamp(nearbyint(v), -128, 127) (ties to even).
  // scale float32 [Cout] = input_scale * weight_scale[c] / output_scale; bias float32 [Cout] = bias / output_scale;
  // residual int8 [num_out, Cout] with residual_scale = its scale / output_scale. map_info (get_indice_pairs')
  // of the map nbr was built from bounds its entries on the host; without it the op checks them itself.
  // Integer max pooling is indice_maxpool on int8 features (exact; outputs start at 0 as for floats).
  m.def(
      "quantized_conv(Tensor features, Tensor filters, Tensor nbr, Tensor scale, Tensor? bias, Tensor? residual, "
      "float residual_scale, int activation, float alpha, Tensor? map_info=None) -> Tensor");
  // Which int8 kernel quantized_conv runs for this tensor's device: avx512_vnni, avx2 or generic on the CPU;
  // the GPU build's body (dp4a, sdot4, mfma_i8, mma_s8, simt).
  m.def("quantized_conv_path(Tensor features) -> str");
  // ---- end int8 inference ----
}
