// Plain C++ entry points of the GPU kernels (csrc/hip/*.cu). No torch and no GPU headers here:
// the glue in csrc/ops/gpu (compiled by the host C++ compiler) calls these with raw device pointers,
// sizes and the current stream as a void*. Every launcher returns 0 on success or a runtime error code
// (see error_string). Launchers never launch a grid of zero blocks: empty work returns 0 at once.
#pragma once
#include <cstdint>

#include "spconv/coords.h"

namespace spconv {
namespace gpu {

enum class DType : int { F32 = 0, F16 = 1, BF16 = 2, F64 = 3 };

const char* error_string(int code);

// Open-addressing hash table of packed int64 keys (coord_hash.h; empty slot = -1): a capacity for `expected`
// keys (a power of two >= 2 * expected, at least 16).
int64_t hash_capacity(int64_t expected);

// ---- regular, transposed and pooling kernel maps (kernel_map.cu): four kernels, one stable sort of the input
// keys, one scan, one host read between the scan and the last kernel ----
// Visit v = r * kvol + k is input rank r (the inputs in (coordinate key, row) order, the CPU route's) through
// offset k. status (int64): the smallest row outside [0, batch_size) x in_shape (INT64_MAX for none), 1 when the
// hash table is full, 1 when two inputs share a coordinate, the number of distinct outputs, then the pairs of
// each offset [kvol].
enum ConvMapStatus : int { kMapBadRow = 0, kMapFull = 1, kMapDupRow = 2, kMapNumOut = 3, kMapCounts = 4 };
struct ConvMapBuffers {
  int64_t* in_keys;  // [n]: the inputs' packed keys; INT64_MAX for a row outside the grid
  int64_t* hkeys;    // [cap], cap = hash_capacity(the most distinct outputs)
  unsigned long long* hvisit;  // [cap]: the smallest visit reaching the slot's output
  int64_t cap;
  int64_t* slot;     // [n * kvol] by visit: the output's slot, or -1
  int64_t* flags;    // [2 * n * kvol]: first visits of outputs by visit, then hits [kvol, n] by input row
  int64_t* status;   // [kMapCounts + kvol]
  int64_t* offsets;  // [kvol + 1]: pair_offsets
};
// 1) Input keys, the hash table cleared, status and offsets zeroed (no bad row).
int conv_map_init(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size,
                  const ConvMapBuffers& b, void* stream);
// 2) sorted_keys / order: in_keys stably sorted and their rows. Every visit's output key goes into the table
// (atomic min of the visit); slots, pair counts, distinct outputs, bad rows, duplicates and a full table in status.
int conv_map_insert(const int32_t* indices, const int64_t* sorted_keys, const int64_t* order, int64_t n,
                    const ConvGeometry& g, bool transpose, const ConvMapBuffers& b, void* stream);
// 3) flags; offsets from the counts.
int conv_map_flags(const int64_t* order, int64_t n, int64_t kvol, const ConvMapBuffers& b, void* stream);
// 4) scan = inclusive prefix sum of flags: output ids in first-seen order (scan[first visit] - 1) and pair
// positions (offsets ascending, input rows ascending within an offset). Writes table [n, kvol] (output id or -1),
// pair_in / pair_out and out_indices [num_out, ndim + 1] (decoded with out_shape).
// out_table (optional, [num_out, kvol] filled with -1 beforehand; only for maps without duplicate coordinates,
// which have one input per entry): the input feeding each output through each offset.
int conv_map_write(const int64_t* order, const int64_t* scan, int64_t n, const ConvGeometry& g, int64_t num_out,
                   const ConvMapBuffers& b, int32_t* table, int32_t* pair_in, int32_t* pair_out,
                   int32_t* out_indices, int32_t* out_table, void* stream);

// ---- submanifold kernel maps (subm_map.cu): three kernels, no host read ----
// status entries (int32): the smallest row whose batch index or coordinates lie outside the grid, the smallest
// row whose coordinate an earlier-inserted row holds (INT32_MAX for none), 1 when the hash table is full, and
// the probe's count of finished blocks.
enum SubmStatus : int { kSubmBadRow = 0, kSubmDupRow = 1, kSubmFull = 2, kSubmBlocksDone = 3, kSubmStatusSize = 4 };
struct SubmMapBuffers {
  int64_t* hkeys;  // [cap], cap = hash_capacity(n)
  int32_t* hvals;  // [cap]
  int64_t cap;
  int32_t* nbr;    // [n, kvol]: nbr[o * kvol + k] = the input feeding output o through offset k, or -1
  int32_t* masks;  // [splits, n]: fused_map_masks' masks of nbr; null: none
  unsigned long long* sort_keys;  // [splits, n]: the masks as unsigned 64-bit sort keys (with masks)
  int splits;
  int64_t* offsets;  // [kvol + 1]: pair_offsets
  int32_t* status;   // [kSubmStatusSize]
};
// Sets every buffer's initial value (keys and table -1, masks, keys and offsets 0, status none).
int subm_map_init(const SubmMapBuffers& b, int64_t n, int64_t kvol, void* stream);
// Inserts every row inside the grid (key -> row); records out-of-grid and repeated rows in status.
int subm_map_insert(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size,
                    const SubmMapBuffers& b, void* stream);
// Fills nbr, masks, sort_keys and offsets. mirrored (odd kernel sizes): looks up offsets 0..kvol/2 only, each
// hit also giving the pair of offset kvol - 1 - k with the sides swapped.
int subm_map_probe(const int32_t* indices, int64_t n, const ConvGeometry& g, int64_t batch_size, bool mirrored,
                   const SubmMapBuffers& b, void* stream);

// ---- native route: gather -> vendor GEMM (ATen) -> scatter-add (grouped) or sum by position ----
// dst[r, :] = src[idx[r], :] for r < m; src and dst of dtype t, c channels, row-major contiguous.
int gather_rows(DType t, const void* src, int64_t c, const int32_t* idx, int64_t m, void* dst, void* stream);
// acc[idx[r], :] += src[r, :]; idx must not repeat within one call (no atomics): maps that repeat a row at one
// offset (duplicate coordinates) are split into rounds by the caller (spconv/pytorch/pair_rounds.py).
// acc is F32 or F64.
int scatter_add_rows(DType src_t, const void* src, int64_t c, const int32_t* idx, int64_t m, DType acc_t,
                     void* acc, void* stream);
// pos [n_dst, kvol] int32, -1 on entry: pos[dst[p], k] = p - offsets[k] for each pair p of offset k (offsets
// [kvol + 1] int64 on the device). A row must not repeat within one offset (the per-offset sums hold one pair
// per (row, offset)): maps that repeat one (duplicate coordinates) are split into rounds by the caller
// (spconv/pytorch/pair_rounds.py).
int pair_positions(const int32_t* dst, const int64_t* offsets, int64_t kvol, int64_t npairs, int64_t n_dst,
                   int32_t* pos, void* stream);
// The products of offsets [k0, k1) as rows of src (pair p at row p - base) summed into acc [n_dst, c] by
// position, offsets ascending: acc = (accumulate ? acc : 0) + products, the per-offset scatter-add's bits.
struct RowSums {
  const int32_t* pos;      // pair_positions' table
  const int64_t* offsets;  // [kvol + 1] on the device
  int64_t kvol, k0, k1, base, n_dst;
  bool accumulate;
};
// src of dtype src_t; acc is F32 or F64.
int sum_rows_by_position(DType src_t, const void* src, int64_t c, const RowSums& r, DType acc_t, void* acc,
                         void* stream);

// ---- fused route ----
// nbr [num_rows, kvol] must hold -1; sets nbr[pair_out[p] * kvol + k(p)] = pair_in[p]. *repeated (one int32,
// 0 on entry; may be null) becomes 1 when two pairs share an (output, offset): the table then holds only one of them.
int fused_map_fill(const int32_t* pair_in, const int32_t* pair_out, const int64_t* pair_offsets, int64_t kvol,
                   int64_t npairs, int64_t num_rows, int32_t* nbr, int32_t* repeated, void* stream);
// masks[s * num_rows + r]: bit ((k - k0_s) / gs_s) set when nbr[r, k] >= 0, for the offsets
// k0_s = s * kvol / S <= k < k1_s of split s, gs_s = ceil((k1_s - k0_s) / 32).
// sort_keys (may be null) [num_splits, num_rows]: the masks as unsigned 64-bit keys (a stable sort gives `order`).
int fused_map_masks(const int32_t* nbr, int64_t num_rows, int64_t kvol, int num_splits, int32_t* masks,
                    unsigned long long* sort_keys, void* stream);
// Output-stationary implicit GEMM: y[r] (+)= sum_k x[nbr[r, k]] @ w[k], tiles of rows taken in `order`,
// offsets whose mask bit is clear in the whole tile skipped. Splits run one after the other (the first
// overwrites y, later ones accumulate). x [n_in, cin], w [kvol, cin, cout], y [n_out, cout], dtype F32/F16/BF16.
// mirror (one split): offset k reads column kvol - 1 - k of nbr, with masks / order over nbr's columns (dinput of
// a mirrored map on its forward table and filters [kvol, cout, cin]). tf32 (F32 only): the caller allows TF32
// operands; where the build has the TF32 body (NVIDIA sm_80+) it runs instead of the SIMT one.
int fused_conv_forward(DType t, const void* x, const void* w, const int32_t* nbr, const int32_t* masks,
                       const int32_t* order, int64_t n_out, int64_t kvol, int64_t cin, int64_t cout,
                       int num_splits, void* y, void* stream, bool mirror = false, bool tf32 = false);
// dW[k] = sum over the pairs p of offset k of x[pair_in[p]]^T dy[pair_out[p]]; split-K over `splits`
// chunks per offset into workspace [kvol, splits, cin, cout] (fp32), then a fixed-order reduction into
// dw [kvol, cin, cout] of dtype t: deterministic, no atomics. tf32: as fused_conv_forward's.
int fused_conv_dfilter(DType t, const void* x, const void* dy, const int32_t* pair_in, const int32_t* pair_out,
                       const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout, int splits,
                       float* workspace, void* dw, void* stream, bool tf32 = false);
// The split-K count of fused_conv_dfilter for npairs pairs (slice = kvol * cin * cout).
int64_t fused_dfilter_split_count(int64_t npairs, int64_t kvol, int64_t slice);
// fused_conv_dfilter from a neighbour table: the pairs of offset k are column k's entries >= 0 in row order
// (rows_out: table [rows = outputs, kvol] of inputs; else [rows = inputs, kvol] of outputs), the split count
// fused_dfilter_split_count of pair_offsets[kvol] - pair_offsets[0] read on the device, at most splits_max
// (workspace: splits_max * kvol * cin * cout floats). The same bits as fused_conv_dfilter on pairs in that
// order. dw null: no filter gradient; wt (with w) non-null: also wt[k][co][ci] = w[k][ci][co].
int fused_conv_dfilter_table(DType t, const void* x, const void* dy, const int32_t* table, int64_t rows,
                             bool rows_out, const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout,
                             int splits_max, float* workspace, void* dw, const void* w, void* wt, void* stream,
                             bool tf32 = false);
// Which kernel bodies fused_conv_forward runs on the current device, as compiled into the code the device runs
// (two int32 on the device): out[0] for 16-bit dtypes 0 SIMT, 1 WMMA, 2 MFMA, 3 the pipelined sm_80 body;
// out[1] 1 where FP32 has the TF32 body. fused_body_name names the one for t (tf32: the caller allows TF32).
int fused_forward_body(int32_t* out, void* stream);
const char* fused_body_name(DType t, const int32_t* body, bool tf32);

// ---- grouped convolution (csrc/hip/grouped_conv.cu; section owner: groups) ----
// Filters w [kvol, groups, cig, cog]; dtype t F32/F16/BF16/F64 with FP32 (F64: FP64) accumulation.
// y [n_rows, groups*cog] = per row r, sum over k with 0 <= nbr[r, k] < n_src of x[nbr[r, k], group] @ w[k, group];
// every element written once (no atomics). dinput: the reversed table and w transposed to [kvol, G, cog, cig].
int grouped_conv_forward(DType t, const void* x, const void* w, const int32_t* nbr, int64_t n_rows, int64_t kvol,
                         int64_t n_src, int64_t groups, int64_t cig, int64_t cog, void* y, void* stream);
// dw [kvol, groups, cig, cog] = sum over input rows i and offsets k with 0 <= nbr_t[i, k] < n_dst of
// x[i, group]^T dy[nbr_t[i, k], group]: `splits` fixed chunks of rows into workspace [splits, dw.numel()]
// (F32; F64 for F64), then added in chunk order. Deterministic, no atomics.
int grouped_conv_dfilter(DType t, const void* x, const void* dy, const int32_t* nbr_t, int64_t n_in, int64_t kvol,
                         int64_t n_dst, int64_t groups, int64_t cig, int64_t cog, int64_t splits, void* workspace,
                         void* dw, void* stream);

// ---- point to voxel (csrc/hip/point_to_voxel.cu; section owner: voxel) ----
// Grid in zyx order (ndim <= 4): vsize, lower corner lo, grid = voxels per dimension; dimension j reads
// point column ndim - 1 - j. points [n, c] of dtype t (F32/F64).
// 1) keys[i] = linear voxel index or -1 (outside); the table (hkeys = -1, hvals = INT32_MAX on entry,
//    cap >= 2n slots) keeps each key's smallest point index; first[i] = 1 for the first point of a voxel.
int p2v_first_points(DType t, const void* points, int64_t n, int64_t c, int ndim, const float* vsize,
                     const float* lo, const int32_t* grid, int64_t* keys, int64_t* hkeys, int32_t* hvals,
                     int64_t cap, int32_t* first, void* stream);
// 2) rank = inclusive prefix sum of first (int32). Voxel ids in first-point order: indices [min(M, max_voxels),
//    ndim] int32 zyx; pc_voxel_id[i] = voxel id, or -1 when outside or beyond max_voxels.
int p2v_assign(const int64_t* keys, int64_t n, const int32_t* first, const int32_t* rank, const int64_t* hkeys,
               int32_t* hvals, int64_t cap, int64_t max_voxels, int ndim, const int32_t* grid, int32_t* indices,
               int64_t* pc_voxel_id, void* stream);
// 3) sorted_vid, perm: pc_voxel_id stably sorted and its permutation. voxels [m, max_points, c] zeroed by the
//    caller; seg_start [m] scratch. Fills voxels and num_per_voxel [m]; empty_mean pads with each voxel's mean.
int p2v_fill(DType t, const void* points, int64_t c, const int64_t* sorted_vid, const int64_t* perm, int64_t n,
             int64_t m, int64_t max_points, bool empty_mean, int64_t* seg_start, void* voxels,
             int32_t* num_per_voxel, void* stream);

// ---- key/value hash table of spconv.pytorch.hash (csrc/hip/hash_table_ops.cu; section owner: voxel) ----
// key_bytes 4 (int32) / 8 (int64), empty slot = the key type's maximum; values copied as raw bits of
// value_bytes 4 / 8. Scratch: first [cap] int32 = INT32_MAX and claimed [cap] uint8 = 0 on entry.
// insert: new keys get the value of their first occurrence (0 when values is null), present keys keep theirs.
int hash_kv_insert(int key_bytes, int value_bytes, void* table_keys, void* table_values, int64_t cap,
                   const void* keys, const void* values, int64_t n, int32_t* first, uint8_t* claimed, void* stream);
// out[i] = value or 0, is_empty[i] = 1 when absent.
int hash_kv_query(int key_bytes, int value_bytes, const void* table_keys, const void* table_values, int64_t cap,
                  const void* keys, int64_t n, void* out, uint8_t* is_empty, void* stream);
// Overwrites present keys (first occurrence wins); is_empty[i] = 1 for absent keys (not inserted).
int hash_kv_insert_exist(int key_bytes, int value_bytes, const void* table_keys, void* table_values, int64_t cap,
                         const void* keys, const void* values, int64_t n, int32_t* first, uint8_t* is_empty,
                         void* stream);

// ---- pooling (csrc/hip/pool.cu) ----
// Pairs grouped by kernel offset (schema.cpp); `offsets` [kvol + 1] is a HOST copy of pair_offsets (one launch
// per non-empty offset, in order, so no atomics on features and results match the CPU route's update order).
// No row may repeat within one offset: maps that do (duplicate coordinates) pool on the CPU (spconv/pytorch/ops.py).
// Features of dtype t, c channels, row-major contiguous; "acc" buffers are F32 (F64 when t is F64).
// out [num_out, c] of dtype t, zero on entry: out = max(0, window max); a NaN input propagates and sticks.
int maxpool_forward(DType t, const void* x, int64_t c, const int32_t* pair_in, const int32_t* pair_out,
                    const int64_t* offsets, int64_t kvol, void* out, void* stream);
// x [num_in, c], y and dy [num_out, c] of dtype t; claimed [num_out * c] and dx [num_in, c] (acc) zero on entry.
// Each (output, channel) gradient goes to the input of the first offset whose value equals y (for a NaN y, the
// first NaN input).
int maxpool_backward(DType t, const void* x, const void* y, const void* dy, int64_t c, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, uint8_t* claimed, void* dx,
                     void* stream);
// acc [num_out, c] and count [num_out] (int32) zero on entry: count = active inputs per output (also for c == 0),
// acc = their mean (sum in offset order, then times 1 / count).
int avgpool_forward(DType t, const void* x, int64_t c, int64_t num_out, const int32_t* pair_in,
                    const int32_t* pair_out, const int64_t* offsets, int64_t kvol, void* acc, int32_t* count,
                    void* stream);
// dy [num_out, c] of dtype t; dx [num_in, c] (acc) zero on entry: dx[in] += dy[out] * (1 / count[out]).
// count must be >= 1 for every output a pair reaches.
int avgpool_backward(DType t, const void* dy, const int32_t* count, int64_t c, const int32_t* pair_in,
                     const int32_t* pair_out, const int64_t* offsets, int64_t kvol, void* dx, void* stream);

// int8 features (max pooling only): the same kernel, exact (max only selects).
int maxpool_forward_int8(const int8_t* x, int64_t c, const int32_t* pair_in, const int32_t* pair_out,
                         const int64_t* offsets, int64_t kvol, int8_t* out, void* stream);

// ---- pooling over neighbour tables (csrc/hip/pool.cu): one launch per op, no zeroed buffers ----
// nbr [num_out, kvol] int32: the input feeding output o through offset k (-1: none); nbr_t [num_in, kvol]: the
// output input i feeds through offset k (-1: none). No row may repeat within one offset (one entry per cell).
// Each output (forward) or input (backward) row walks its kvol offsets in ascending order, the CPU route's order,
// so the results are its bits; every element of every output buffer is written.
// argmax [num_out, c] records, per (output, channel), the offset whose input takes the gradient: uint8 with
// 255 = none (argmax_bytes 1, kvol < 255) or int32 with -1 = none (argmax_bytes 4); null (0 bytes): not recorded.
// out [num_out, c] of dtype t = max(0, window max) (a NaN input propagates and sticks; the gradient goes to the
// first input equal to the output, for a NaN output the first NaN input).
int maxpool_table_forward(DType t, const void* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                          void* out, void* argmax, int argmax_bytes, void* stream);
int maxpool_table_forward_int8(const int8_t* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                               int8_t* out, void* stream);
// dy [num_out, c], dx [num_in, c] of dtype t: dx[i] = sum over offsets k (ascending) of dy[nbr_t[i, k]] where
// argmax says k, in FP32 (FP64 for double), rounded once.
int maxpool_table_backward(DType t, const void* dy, const void* argmax, int argmax_bytes, int64_t c,
                           const int32_t* nbr_t, int64_t num_in, int64_t kvol, void* dx, void* stream);
// out [num_out, c] of dtype t: the window sum in offset order times 1 / count; count [num_out] int32 (written
// also for c == 0).
int avgpool_table_forward(DType t, const void* x, int64_t c, const int32_t* nbr, int64_t num_out, int64_t kvol,
                          void* out, int32_t* count, void* stream);
// dx [num_in, c] of dtype t: dx[i] = sum over offsets k (ascending) of dy[o] * (1 / count[o]), o = nbr_t[i, k],
// the product and the sum each rounded. count must be >= 1 for every output nbr_t names.
int avgpool_table_backward(DType t, const void* dy, const int32_t* count, int64_t c, const int32_t* nbr_t,
                           int64_t num_in, int64_t kvol, void* dx, void* stream);
// out [num_rows, kvol], -1 on entry: out[table[r, k], k] = r for every entry of table [rows, kvol] in
// [0, num_rows). With flags (int32 [2], 0 on entry): flags[0] = 1 for an entry outside [-1, num_rows) (skipped),
// flags[1] = 1 when two rows name one cell (the first write stays). Without, entries are trusted unique.
int transpose_neighbour_table(const int32_t* table, int64_t rows, int64_t kvol, int64_t num_rows, int32_t* out,
                              int32_t* flags, void* stream);

// ---- int8 inference (csrc/hip/quantized_conv.cu; section owner: quantization) ----
// y [n_out, cout] int8 = the schema's epilogue of acc[r, c] = sum over the columns j < T of nbr [n_out, T] with
// 0 <= nbr[r, j] < n_in of dot(x[nbr[r, j]], w[j % kvol][:, c]) (exact int32). Operands packed as int32 words of
// 4 int8 along Cin, zero-padded: x [n_in, k4], w [kvol, k4, cout]. scale [cout]; bias [cout] and residual
// [n_out, cout] may be null; activation 0 none, 1 ReLU, 2 LeakyReLU(alpha). Every output written once.
int quantized_conv_forward(const int32_t* x, int64_t n_in, int64_t k4, const int32_t* w, int64_t kvol, int64_t cout,
                           const int32_t* nbr, int64_t n_out, int64_t T, const float* scale, const float* bias,
                           const int8_t* residual, float residual_scale, int activation, float alpha, int8_t* y,
                           void* stream);
// Which body quantized_conv_forward runs on the current device: *out (one int32 on the device) = 0 plain C,
// 1 sdot4, 2 dp4a, 3 mfma_i8, 4 mma_s8; quantized_body_name names it.
int quantized_conv_body(int32_t* out, void* stream);
const char* quantized_body_name(int32_t body);

}  // namespace gpu
}  // namespace spconv
