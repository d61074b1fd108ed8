// Argument checks shared by every backend's glue: run once per op call, before any kernel.
// Messages name the argument so the Python exception says what to fix.
#pragma once
#include <ATen/ATen.h>

#include <optional>
#include <vector>

#include "spconv/coords.h"

namespace spconv {
namespace ops {

// Every device->host copy the op glue makes goes through to_host, so that tests of the GPU path can count them
// (the host_copy_count op: the copies this op library made since it was loaded, CPU tensors included).
at::Tensor to_host(const at::Tensor& t);
int64_t host_copy_count();

void check_indices(const at::Tensor& indices, int64_t ndim);

// Builds the geometry, checking each list has ndim positive entries.
ConvGeometry make_geometry(int64_t ndim, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
                           at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation);

// batch_size >= 1 and batch_size x each grid volume below 2^63 (the packed int64 coordinate keys).
void check_grid_volume(int64_t batch_size, const ConvGeometry& g);

// Every coordinate inside spatial_shape and every batch index in [0, batch_size): runs on the CPU
// copy of the indices (the GPU glue passes one).
void check_coordinates(const at::Tensor& indices_cpu, int64_t batch_size, const ConvGeometry& g);
// The same checks for indices on any device in two steps, so that a GPU caller can fold the one device->host copy
// into its own: coordinate_extremes gives the per-column minima then maxima (int64 [2 * (ndim + 1)], on the
// indices' device; empty for no rows), check_coordinate_extremes reads their host copy (and copies the indices
// only when a check fails, for the message).
at::Tensor coordinate_extremes(const at::Tensor& indices);
void check_coordinate_extremes(const int64_t* extremes_host, const at::Tensor& indices, int64_t batch_size,
                               const ConvGeometry& g);

void check_pairs(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                 const at::Tensor& features);

// pair_positions: pair_dst int32 1-D, pair_offsets int64 [kvol + 1] on its device, num_dst >= 0 (the rows are
// bounded by the kernel that fills the table).
void check_pair_positions_args(const at::Tensor& pair_dst, const at::Tensor& pair_offsets, int64_t num_dst);

// pair_offsets (read on the host) start at 0, never decrease and end at npairs; with `extremes`
// ({min, max} of pair_in, then of pair_out) every pair row lies in [0, num_in) / [0, num_out).
void check_pair_layout_host(const int64_t* offsets, int64_t kvol, int64_t npairs, const int64_t* extremes,
                            int64_t num_in, int64_t num_out);

// map_info: what get_indice_pairs knows of the map it built, on the host, so that the ops using the map need no
// device->host copy to check it. int64 [kvol + 4] on the CPU: pair_offsets, then in_rows and out_rows (every
// pair_in < in_rows, every pair_out < out_rows) and flags: 1 = repeat_free (no row repeats within one offset on
// either side, i.e. no duplicate input coordinates), 2 = mirrored (offset k's pairs are offset kvol - 1 - k's with
// the sides swapped: a SubM map of odd kernel sizes). An op given map_info trusts it to describe its pairs (and,
// for indice_avgpool_backward, `count` to be indice_avgpool's over the same map): it checks only what the host can.
constexpr int64_t kMapInfoExtras = 3;
constexpr int64_t kMapRepeatFree = 1, kMapMirrored = 2;
struct MapInfo {
  at::Tensor offsets;  // int64 [kvol + 1] on the CPU (a view of map_info)
  int64_t in_rows, out_rows;
  bool repeat_free, mirrored;
};
at::Tensor make_map_info(const at::Tensor& offsets_host, int64_t in_rows, int64_t out_rows, bool repeat_free,
                         bool mirrored = false);
// Checks map_info's dtype, device, size and layout against kvol and the number of pairs (host only; npairs < 0:
// not known to the caller).
std::optional<MapInfo> read_map_info(const std::optional<at::Tensor>& map_info, int64_t kvol, int64_t npairs);

struct HostPairOffsets {
  at::Tensor offsets;  // int64 [kvol + 1] on the CPU
  at::Tensor extra;    // the host copy of `extra` (empty when none was given, or when map_info was)
  bool repeat_free = false;  // map_info's flags (false without map_info: not known)
  bool mirrored = false;
};

// check_pair_layout_host on tensors, so a bad kernel map fails with a message instead of reading or writing
// out of bounds. With map_info: host checks only (its rows against num_in / num_out). Without, pairs on a GPU
// cost one device->host copy, which also carries `extra` (1-D int64, on the pairs' device) for the caller's
// own checks.
HostPairOffsets check_pair_rows(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                int64_t num_in, int64_t num_out, const std::optional<at::Tensor>& map_info,
                                const at::Tensor& extra = at::Tensor());

void check_features(const at::Tensor& features, const char* name);

void check_filters(const at::Tensor& filters, const at::Tensor& features, int64_t kvol);

// get_indice_pairs: indices and layer geometry (subm needs stride 1). Returns the geometry.
ConvGeometry check_indice_pairs_args(const at::Tensor& indices, at::IntArrayRef spatial_shape,
                                     at::IntArrayRef out_shape, at::IntArrayRef ksize, at::IntArrayRef stride,
                                     at::IntArrayRef padding, at::IntArrayRef dilation, bool subm);

// Whether a SubM map of this geometry is mirrored (map_info): with odd kernel sizes, offset kvol - 1 - k is
// offset k negated, so each neighbour pair appears once in each direction.
inline bool subm_map_mirrored(const ConvGeometry& g) {
  for (int d = 0; d < g.ndim; ++d)
    if (g.ksize[d] % 2 == 0) return false;
  return true;
}

// Pooling ops (CPU and GPU glue): features, pairs, sizes, dtypes and devices, before the pair rows are read.
// allow_int8: a glue whose max pool forward takes int8 features (exact; no backward) says so.
void check_pool_args(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                     const at::Tensor& pair_offsets, int64_t num_out, bool allow_int8 = false);
void check_maxpool_backward_args(const at::Tensor& features, const at::Tensor& out_features,
                                 const at::Tensor& out_grad, const at::Tensor& pair_in, const at::Tensor& pair_out,
                                 const at::Tensor& pair_offsets);
void check_avgpool_backward_args(const at::Tensor& out_grad, const at::Tensor& count, const at::Tensor& pair_in,
                                 const at::Tensor& pair_out, const at::Tensor& pair_offsets, int64_t num_in);

// indice_conv_backward: everything the forward checks, plus out_grad against the filters and features.
void check_conv_backward_args(const at::Tensor& features, const at::Tensor& filters, const at::Tensor& out_grad,
                              const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets);

}  // namespace ops
}  // namespace spconv
