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

// Open-addressing hash table of packed int64 keys (empty slot = -1) with int32 values.
// Capacity is a power of two >= 2 * expected entries.
int64_t hash_capacity(int64_t expected);
// Sets all keys to -1 and values to -1.
int hash_clear(int64_t* keys, int32_t* values, int64_t cap, void* stream);

// ---- kernel maps ----
// Inserts probe at most cap slots: *full (one int32 on the device, 0 on entry) becomes 1 when a key found no
// slot (the caller raises). Lookups of absent keys in a full table return -1.
// Regular (transpose=false) or transposed conv: keys[i * kvol + k] = packed output coordinate or -1.
int conv_candidate_keys(const int32_t* indices, int64_t n, const ConvGeometry& g, bool transpose, int64_t* keys,
                        void* stream);
// Inserts every key != -1 (values untouched).
int hash_insert_keys(const int64_t* keys, int64_t count, int64_t* hkeys, int64_t cap, int32_t* full, void* stream);
// For r < m: the slot of uniq[r] gets value r (uniq must already be inserted).
int hash_assign_rank(const int64_t* uniq, int64_t m, const int64_t* hkeys, int32_t* hvals, int64_t cap,
                     void* stream);
// out[t] = value of keys[t], or -1 for key -1 / absent.
int hash_lookup(const int64_t* keys, int64_t count, const int64_t* hkeys, const int32_t* hvals, int64_t cap,
                int32_t* out, void* stream);
// out_indices[r] = (batch, c0, ..., c_{ndim-1}) unpacked from keys[r] with the grid shape.
int decode_keys(const int64_t* keys, int64_t m, const ConvGeometry& g, bool use_out_shape, int32_t* out_indices,
                void* stream);

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

// ---- native route: gather -> vendor GEMM (ATen) -> scatter-add ----
// dst[r, :] = src[idx[r], :] for r < m; src and dst of dtype t, c channels, row-major contiguous.
int gather_rows(DType t, const void* src, int64_t c, const int32_t* idx, int64_t m, void* dst, void* stream);
// acc[idx[r], :] += src[r, :]; idx must not repeat within one call (no atomics): maps that repeat a row at one
// offset (duplicate coordinates) are split into rounds by the caller (spconv/pytorch/pair_rounds.py).
// acc is F32 or F64.
int scatter_add_rows(DType src_t, const void* src, int64_t c, const int32_t* idx, int64_t m, DType acc_t,
                     void* acc, void* stream);

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
// a mirrored map on its forward table and filters [kvol, cout, cin]).
int fused_conv_forward(DType t, const void* x, const void* w, const int32_t* nbr, const int32_t* masks,
                       const int32_t* order, int64_t n_out, int64_t kvol, int64_t cin, int64_t cout,
                       int num_splits, void* y, void* stream, bool mirror = false);
// dW[k] = sum over the pairs p of offset k of x[pair_in[p]]^T dy[pair_out[p]]; split-K over `splits`
// chunks per offset into workspace [kvol, splits, cin, cout] (fp32), then a fixed-order reduction into
// dw [kvol, cin, cout] of dtype t: deterministic, no atomics.
int fused_conv_dfilter(DType t, const void* x, const void* dy, const int32_t* pair_in, const int32_t* pair_out,
                       const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout, int splits,
                       float* workspace, void* dw, void* stream);
// The split-K count of fused_conv_dfilter for npairs pairs (slice = kvol * cin * cout).
int64_t fused_dfilter_split_count(int64_t npairs, int64_t kvol, int64_t slice);
// fused_conv_dfilter from a neighbour table: the pairs of offset k are column k's entries >= 0 in row order
// (rows_out: table [rows = outputs, kvol] of inputs; else [rows = inputs, kvol] of outputs), the split count
// fused_dfilter_split_count of pair_offsets[kvol] - pair_offsets[0] read on the device, at most splits_max
// (workspace: splits_max * kvol * cin * cout floats). The same bits as fused_conv_dfilter on pairs in that
// order. dw null: no filter gradient; wt (with w) non-null: also wt[k][co][ci] = w[k][ci][co].
int fused_conv_dfilter_table(DType t, const void* x, const void* dy, const int32_t* table, int64_t rows,
                             bool rows_out, const int64_t* pair_offsets, int64_t kvol, int64_t cin, int64_t cout,
                             int splits_max, float* workspace, void* dw, const void* w, void* wt, void* stream);
// Which kernel body fused_conv_forward runs on the current device: *out (one int32 on the device) = 0 SIMT,
// 1 WMMA, 2 MFMA for 16-bit dtypes, as compiled into the code the device runs; fused_body_name names it for t.
int fused_forward_body(int32_t* out, void* stream);
const char* fused_body_name(DType t, int32_t body);

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
