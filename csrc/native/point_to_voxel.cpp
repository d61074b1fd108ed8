#include "point_to_voxel.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "hash_table.h"

namespace spconv {
namespace native {

template <typename T>
void point_voxel_keys(const T* points, int64_t n, int64_t c, const VoxelGridSpec& spec, int64_t* keys) {
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      const T* p = points + i * c;
      int64_t key = 0;
      bool inside = true;
      for (int j = 0; j < spec.ndim; ++j) {
        // Same arithmetic as spconv (T op float promotes to T), so boundary points land in the same voxel.
        const T q = std::floor((p[spec.ndim - 1 - j] - static_cast<T>(spec.lo[j])) / static_cast<T>(spec.vsize[j]));
        // NaN fails both comparisons below, so it is treated as outside.
        if (!(q >= T(0) && q < static_cast<T>(spec.grid[j]))) {
          inside = false;
          break;
        }
        key = key * spec.grid[j] + static_cast<int64_t>(q);
      }
      keys[i] = inside ? key : -1;
    }
  });
}

int64_t assign_voxels(const int64_t* keys, int64_t n, int64_t max_voxels, int64_t* pc_voxel_id, int32_t* slot,
                      std::vector<int64_t>& voxel_keys, std::vector<int32_t>& counts) {
  voxel_keys.clear();
  counts.clear();
  CoordHashTable table(std::min<int64_t>(n, max_voxels));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t key = keys[i];
    if (key < 0) {
      pc_voxel_id[i] = -1;
      continue;
    }
    int32_t id = table.find(key);
    if (id < 0) {
      const int64_t next = static_cast<int64_t>(voxel_keys.size());
      if (next >= max_voxels) {  // the voxel cap drops new voxels; points of known voxels still count
        pc_voxel_id[i] = -1;
        continue;
      }
      id = table.insert(key, static_cast<int32_t>(next));
      voxel_keys.push_back(key);
      counts.push_back(0);
    }
    pc_voxel_id[i] = id;
    slot[i] = counts[id]++;
  }
  return static_cast<int64_t>(voxel_keys.size());
}

void decode_voxel_keys(const int64_t* voxel_keys, int64_t m, const VoxelGridSpec& spec, int32_t* indices) {
  at::parallel_for(0, m, 8192, [&](int64_t b, int64_t e) {
    for (int64_t v = b; v < e; ++v) {
      int64_t key = voxel_keys[v];
      for (int j = spec.ndim - 1; j >= 0; --j) {
        indices[v * spec.ndim + j] = static_cast<int32_t>(key % spec.grid[j]);
        key /= spec.grid[j];
      }
    }
  });
}

template <typename T>
void scatter_points(const T* points, int64_t n, int64_t c, const int64_t* pc_voxel_id, const int32_t* slot,
                    int64_t max_points, T* voxels) {
  at::parallel_for(0, n, 4096, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      if (pc_voxel_id[i] < 0 || slot[i] >= max_points) continue;
      T* dst = voxels + (pc_voxel_id[i] * max_points + slot[i]) * c;
      const T* src = points + i * c;
      for (int64_t k = 0; k < c; ++k) dst[k] = src[k];
    }
  });
}

template <typename T>
void fill_empty_with_mean(T* voxels, const int32_t* num_per_voxel, int64_t m, int64_t max_points, int64_t c) {
  at::parallel_for(0, m, 1024, [&](int64_t b, int64_t e) {
    std::vector<double> mean(static_cast<size_t>(c));
    for (int64_t v = b; v < e; ++v) {
      T* vox = voxels + v * max_points * c;
      const int64_t num = num_per_voxel[v];
      if (num <= 0 || num >= max_points) continue;
      std::fill(mean.begin(), mean.end(), 0.0);  // reset per voxel (spconv's CPU build does not)
      for (int64_t j = 0; j < num; ++j)
        for (int64_t k = 0; k < c; ++k) mean[k] += static_cast<double>(vox[j * c + k]);
      for (int64_t k = 0; k < c; ++k) mean[k] /= static_cast<double>(num);
      for (int64_t j = num; j < max_points; ++j)
        for (int64_t k = 0; k < c; ++k) vox[j * c + k] = static_cast<T>(mean[k]);
    }
  });
}

template void point_voxel_keys<float>(const float*, int64_t, int64_t, const VoxelGridSpec&, int64_t*);
template void point_voxel_keys<double>(const double*, int64_t, int64_t, const VoxelGridSpec&, int64_t*);
template void scatter_points<float>(const float*, int64_t, int64_t, const int64_t*, const int32_t*, int64_t, float*);
template void scatter_points<double>(const double*, int64_t, int64_t, const int64_t*, const int32_t*, int64_t,
                                     double*);
template void fill_empty_with_mean<float>(float*, const int32_t*, int64_t, int64_t, int64_t);
template void fill_empty_with_mean<double>(double*, const int32_t*, int64_t, int64_t, int64_t);

}  // namespace native
}  // namespace spconv
