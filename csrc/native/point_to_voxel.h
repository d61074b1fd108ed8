// Point cloud -> voxels on the CPU (native route). Everything is in ZYX order: grid dimension j reads
// point column ndim - 1 - j, as spconv does. Voxels are numbered in the order of their first point and
// hold their points in point order, so the result is deterministic and independent of the thread count.
#pragma once
#include <cstdint>
#include <vector>

namespace spconv {
namespace native {

constexpr int kMaxVoxelDim = 4;

struct VoxelGridSpec {
  int ndim;
  float vsize[kMaxVoxelDim];  // voxel size per grid dimension (zyx)
  float lo[kMaxVoxelDim];     // lower corner of the range (zyx)
  int32_t grid[kMaxVoxelDim]; // number of voxels per grid dimension (zyx)
};

// keys[i] = linear voxel index of point i in the zyx grid (last dimension fastest), or -1 when the
// point lies outside the range. Coordinates are computed as spconv does: floor((p - lo) / vsize) in the
// points' precision with lo and vsize held as float32. Parallel over points.
template <typename T>
void point_voxel_keys(const T* points, int64_t n, int64_t c, const VoxelGridSpec& spec, int64_t* keys);

// Numbers voxels in first-point order (at most max_voxels of them). For every point: pc_voxel_id[i] =
// its voxel or -1 (outside the range, or its voxel came after the first max_voxels), slot[i] = its
// position among the points of that voxel. voxel_keys receives the key of every voxel, counts the
// number of points that fell in it (before the per-voxel cap). Sequential: this fixes the order.
int64_t assign_voxels(const int64_t* keys, int64_t n, int64_t max_voxels, int64_t* pc_voxel_id, int32_t* slot,
                      std::vector<int64_t>& voxel_keys, std::vector<int32_t>& counts);

// indices[v] = zyx coordinates of voxel_keys[v]. Parallel over voxels.
void decode_voxel_keys(const int64_t* voxel_keys, int64_t m, const VoxelGridSpec& spec, int32_t* indices);

// voxels [m, max_points, c] (zeroed by the caller): voxels[id, slot] = point i for slot < max_points.
// Each point owns its destination row, so this runs in parallel over points.
template <typename T>
void scatter_points(const T* points, int64_t n, int64_t c, const int64_t* pc_voxel_id, const int32_t* slot,
                    int64_t max_points, T* voxels);

// Fills the unused rows of every voxel with the mean of its stored rows (summed in double, in row
// order). num_per_voxel >= 1 for every voxel. Parallel over voxels.
template <typename T>
void fill_empty_with_mean(T* voxels, const int32_t* num_per_voxel, int64_t m, int64_t max_points, int64_t c);

}  // namespace native
}  // namespace spconv
