// The ring of unchecked submanifold map statuses (subm_pending.h says why it exists).
#include "subm_pending.h"

#include <torch/library.h>

#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "../../hip/launchers.h"
#include "../checks.h"
#include "../op_library.h"
#include "subm_map.h"

namespace spconv {
namespace ops {

// One map whose status row has not been read: what its error message needs.
struct PendingMap {
  at::Tensor indices;
  int64_t batch_size;
  ConvGeometry g;
  const void* status;
  bool live;  // false once the map's own read checked it
};

struct PendingSubm {
  at::Tensor ring;  // int32 [kSubmPendingRows * kSubmStatusSize] on the device
  std::vector<PendingMap> maps;
};

namespace {

constexpr int64_t kRow = gpu::kSubmStatusSize;

using DeviceKey = std::pair<int, int>;
DeviceKey key_of(const at::Device& d) { return {static_cast<int>(d.type()), static_cast<int>(d.index())}; }

std::mutex registry_mutex;
std::map<DeviceKey, std::shared_ptr<PendingSubm>>& registry() {
  static auto* r = new std::map<DeviceKey, std::shared_ptr<PendingSubm>>();  // never destroyed: no exit-order race
  return *r;
}

PendingSubmRows rows_of(std::shared_ptr<PendingSubm> p) {
  bool any = false;
  for (const PendingMap& m : p->maps) any = any || m.live;
  if (!any) return {};
  at::Tensor statuses = p->ring.narrow(0, 0, static_cast<int64_t>(p->maps.size()) * kRow);
  return {statuses, std::move(p)};
}

// Its own host read: for a full ring, and for the debug op.
void read_and_check(const PendingSubmRows& rows) {
  if (!rows.statuses.defined()) return;
  const at::Tensor host = to_host(rows.statuses).to(at::kLong);
  check_subm_statuses(rows, host.const_data_ptr<int64_t>());
}

// The CPU route's error for a map's indices, saying where the check was deferred from.
void check_earlier_map(const PendingMap& m, const int64_t* status_host) {
  try {
    check_subm_status(status_host, m.indices, m.batch_size, m.g);
  } catch (const c10::ValueError& e) {
    TORCH_CHECK_VALUE(false, "a submanifold layer's kernel map, built earlier without a host read, found bad "
                      "indices (checked at this map's host read): ", e.what_without_backtrace());
  }
}

}  // namespace

at::Tensor subm_status_row(const at::Tensor& indices, int64_t batch_size, const ConvGeometry& g) {
  const DeviceKey key = key_of(indices.device());
  for (;;) {
    PendingSubmRows full;
    {
      std::lock_guard<std::mutex> lock(registry_mutex);
      std::shared_ptr<PendingSubm>& p = registry()[key];
      if (!p) {
        p = std::make_shared<PendingSubm>();
        p->ring = at::empty({kSubmPendingRows * kRow}, indices.options().dtype(at::kInt));
      }
      if (static_cast<int64_t>(p->maps.size()) < kSubmPendingRows) {
        at::Tensor row = p->ring.narrow(0, static_cast<int64_t>(p->maps.size()) * kRow, kRow);
        p->maps.push_back({indices, batch_size, g, row.const_data_ptr(), true});
        return row;
      }
      full = rows_of(std::move(p));
    }
    read_and_check(full);  // before this map takes a row: if it raises, this map is never built
  }
}

void forget_subm_status(const at::Tensor& status) {
  std::lock_guard<std::mutex> lock(registry_mutex);
  auto it = registry().find(key_of(status.device()));
  if (it == registry().end() || !it->second) return;
  for (PendingMap& m : it->second->maps)
    if (m.status == status.const_data_ptr()) m.live = false;
}

PendingSubmRows take_pending_subm(const at::Device& device) {
  std::shared_ptr<PendingSubm> p;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto it = registry().find(key_of(device));
    if (it == registry().end() || !it->second) return {};
    p = std::move(it->second);
    registry().erase(it);
  }
  return rows_of(std::move(p));
}

void check_subm_statuses(const PendingSubmRows& rows, const int64_t* h) {
  if (!rows.maps) return;
  for (size_t i = 0; i < rows.maps->maps.size(); ++i) {
    const PendingMap& m = rows.maps->maps[i];
    if (m.live) check_earlier_map(m, h + i * kRow);
  }
}

namespace {

// Tests and benchmarks start a count with no earlier map's check pending (it would land in their count).
void debug_check_pending_maps() {
  std::vector<PendingSubmRows> all;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    for (auto& [key, p] : registry())
      if (p) all.push_back(rows_of(std::move(p)));
    registry().clear();
  }
  for (const PendingSubmRows& rows : all) read_and_check(rows);
}

}  // namespace

}  // namespace ops
}  // namespace spconv

SPCONV_DEBUG_SCHEMA_FRAGMENT(m) { m.def("debug_check_pending_maps() -> ()", &spconv::ops::debug_check_pending_maps); }
