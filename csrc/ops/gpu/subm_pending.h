// The submanifold maps' deferred checks. A SubM map is built with no host read, so the device's verdict on its
// indices (a coordinate out of the grid, a repeated coordinate, a full table) waits on the device: its status is a
// row of a per-device ring, and the next host read of the GPU glue (a regular, transposed or pooling map's one
// read) carries the ring's rows with its own. A flagged row raises there, with the CPU route's message for the
// SubM layer's indices. A map whose pairs are read (subm_pairs_of) is checked by that read and leaves the ring.
// A full ring (kSubmPendingRows maps with no read between them) is read on its own, so a network of SubM layers
// alone pays one host wait per kSubmPendingRows maps.
#pragma once
#include <ATen/ATen.h>

#include <memory>

#include "spconv/coords.h"

namespace spconv {
namespace ops {

constexpr int64_t kSubmPendingRows = 64;

// The status row (int32 [kSubmStatusSize], a view of the ring) for a map about to be built on these indices.
at::Tensor subm_status_row(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g);

// The map owning `status` was checked by its own host read: its row no longer raises.
void forget_subm_status(const at::Tensor& status);

// The rows still unchecked on `device`, taken from the ring: their statuses (int32 [rows * kSubmStatusSize], on
// the device; undefined when none) to copy to the host with the caller's read, then check_subm_statuses.
struct PendingSubm;
struct PendingSubmRows {
  at::Tensor statuses;
  std::shared_ptr<PendingSubm> maps;
};
PendingSubmRows take_pending_subm(const at::Device& device);

// Raises the error of the first flagged row (the host copy of rows.statuses, widened to int64), if any.
void check_subm_statuses(const PendingSubmRows& rows, const int64_t* statuses_host);

}  // namespace ops
}  // namespace spconv
