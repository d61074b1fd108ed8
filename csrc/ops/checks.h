// Argument checks shared by every backend's glue: run once per op call, before any kernel.
// Messages name the argument so the Python exception says what to fix.
#pragma once
#include <ATen/ATen.h>

#include <vector>

#include "spconv/coords.h"

namespace spconv {
namespace ops {

void check_indices(const at::Tensor& indices, int64_t ndim);

// Builds the geometry, checking each list has ndim positive entries.
ConvGeometry make_geometry(int64_t ndim, at::IntArrayRef spatial_shape, at::IntArrayRef out_shape,
                           at::IntArrayRef ksize, at::IntArrayRef stride, at::IntArrayRef padding,
                           at::IntArrayRef dilation);

// Every coordinate inside spatial_shape and every batch index in [0, batch_size): runs on the CPU
// copy of the indices (the GPU glue passes one).
void check_coordinates(const at::Tensor& indices_cpu, int64_t batch_size, const ConvGeometry& g);
// The same checks for indices on any device, copying only the per-column extremes to the host (and the indices
// only when a check fails, for the message).
void check_coordinates_on_device(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g);

void check_pairs(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                 const at::Tensor& features);

// pair_offsets (read on the host) start at 0, never decrease and end at npairs; with `extremes`
// ({min, max} of pair_in, then of pair_out) every pair row lies in [0, num_in) / [0, num_out).
void check_pair_layout_host(const int64_t* offsets, int64_t kvol, int64_t npairs, const int64_t* extremes,
                            int64_t num_in, int64_t num_out);

struct HostPairOffsets {
  at::Tensor offsets;  // int64 [kvol + 1] on the CPU
  at::Tensor extra;    // the host copy of `extra` (empty when none was given)
};

// check_pair_layout_host on tensors, so a bad kernel map fails with a message instead of reading or writing
// out of bounds. Pairs on a GPU cost one device->host copy, which also carries `extra` (1-D int64, on the
// pairs' device) for the caller's own checks.
HostPairOffsets check_pair_rows(const at::Tensor& pair_in, const at::Tensor& pair_out, const at::Tensor& pair_offsets,
                                int64_t num_in, int64_t num_out, const at::Tensor& extra = at::Tensor());

void check_features(const at::Tensor& features, const char* name);

void check_filters(const at::Tensor& filters, const at::Tensor& features, int64_t kvol);

// get_indice_pairs: indices and layer geometry (subm needs stride 1). Returns the geometry.
ConvGeometry check_indice_pairs_args(const at::Tensor& indices, at::IntArrayRef spatial_shape,
                                     at::IntArrayRef out_shape, at::IntArrayRef ksize, at::IntArrayRef stride,
                                     at::IntArrayRef padding, at::IntArrayRef dilation, bool subm);

// Pooling ops (CPU and GPU glue): features, pairs, sizes, dtypes and devices, before the pair rows are read.
void check_pool_args(const at::Tensor& features, const at::Tensor& pair_in, const at::Tensor& pair_out,
                     const at::Tensor& pair_offsets, int64_t num_out);
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
