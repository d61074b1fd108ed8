"""Voxelization: spconv.pytorch.utils.PointToVoxel and spconv.utils.Point2Voxel* against a NumPy reference."""
import numpy as np
import pytest
import torch

import spconv._backend as backend
from spconv.pytorch.utils import PointToVoxel, calc_point2voxel_meta_data, gather_features_by_pc_voxel_id
from spconv.utils import Point2VoxelCPU1d, Point2VoxelCPU3d, Point2VoxelCPU4d

GPU = torch.cuda.is_available() and backend.has_gpu_kernels()
needs_gpu = pytest.mark.gpu  # skipped without a GPU (conftest)


def reference(pc, vsize_xyz, range_xyz, max_voxels, max_points, empty_mean=False):
    """Sequential NumPy voxelization with spconv's float32 arithmetic; mean padding done right."""
    ndim = len(vsize_xyz)
    vs = np.asarray(vsize_xyz, np.float32)[::-1]
    lo = np.asarray(range_xyz[:ndim], np.float32)[::-1]
    hi = np.asarray(range_xyz[ndim:], np.float32)[::-1]
    grid = np.floor((hi - lo) / vs + np.float32(0.5)).astype(np.int64)
    zyx = pc[:, :ndim][:, ::-1]
    q = np.floor((zyx - lo.astype(pc.dtype)) / vs.astype(pc.dtype))
    voxel_of, order, counts = {}, [], []
    pc_voxel_id = np.full(pc.shape[0], -1, np.int64)
    voxels = np.zeros((0, max_points, pc.shape[1]), pc.dtype)
    rows = []
    for i in range(pc.shape[0]):
        c = q[i]
        if not (np.all(c >= 0) and np.all(c < grid)):
            continue
        key = tuple(int(v) for v in c)
        if key not in voxel_of:
            if len(order) >= max_voxels:
                continue
            voxel_of[key] = len(order)
            order.append(key)
            counts.append(0)
            rows.append(np.zeros((max_points, pc.shape[1]), pc.dtype))
        v = voxel_of[key]
        pc_voxel_id[i] = v
        if counts[v] < max_points:
            rows[v][counts[v]] = pc[i]
        counts[v] += 1
    num = np.minimum(np.asarray(counts, np.int64), max_points).astype(np.int32)
    if rows:
        voxels = np.stack(rows)
    if empty_mean:
        for v in range(len(rows)):
            mean = voxels[v, :num[v]].astype(np.float64).mean(axis=0)
            voxels[v, num[v]:] = mean.astype(pc.dtype)
    indices = np.asarray(order, np.int32).reshape(-1, ndim)
    return voxels, indices, num, pc_voxel_id


def random_cloud(n, ndim=3, c=4, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    pc = rng.uniform(-1.0, 11.0, size=(n, c)).astype(dtype)  # some points fall outside [0, 10)
    # Clustered points so that voxels hold several points and the per-voxel cap is reached.
    pc[: n // 2, :ndim] = np.round(pc[: n // 2, :ndim]) + dtype(0.25)
    return pc


def check_against_reference(pc, vsize, rng, max_voxels, max_points, empty_mean=False, device="cpu"):
    gen = PointToVoxel(vsize, rng, pc.shape[1], max_voxels, max_points, device=torch.device(device))
    voxels, indices, num, pc_voxel_id = gen.generate_voxel_with_id(torch.from_numpy(pc).to(device),
                                                                   empty_mean=empty_mean)
    rv, ri, rn, rid = reference(pc, vsize, rng, max_voxels, max_points, empty_mean)
    assert voxels.dtype == torch.float32 and indices.dtype == torch.int32 and num.dtype == torch.int32
    assert pc_voxel_id.dtype == torch.int64
    np.testing.assert_array_equal(indices.cpu().numpy(), ri)
    np.testing.assert_array_equal(num.cpu().numpy(), rn)
    np.testing.assert_array_equal(pc_voxel_id.cpu().numpy(), rid)
    np.testing.assert_allclose(voxels.cpu().numpy(), rv.astype(np.float32), rtol=1e-6, atol=1e-6)
    return voxels, indices, num, pc_voxel_id


@pytest.mark.parametrize("max_voxels,max_points", [(100000, 64), (40, 3), (7, 1)])
def test_point_to_voxel_matches_reference(max_voxels, max_points):
    pc = random_cloud(3000)
    voxels, _, num, _ = check_against_reference(pc, [1.0, 1.0, 1.0], [0, 0, 0, 10, 10, 10], max_voxels, max_points)
    assert voxels.shape[0] <= max_voxels and int(num.max()) <= max_points


@pytest.mark.parametrize("ndim", [1, 2, 4])
def test_point_to_voxel_other_ndims(ndim):
    pc = random_cloud(800, ndim=ndim, c=max(ndim, 3), seed=ndim)
    check_against_reference(pc, [0.5] * ndim, [0.0] * ndim + [10.0] * ndim, 500, 4)


def test_point_order_first_point_order_and_zyx():
    # x, y, z, intensity. Voxel size 1: points 0 and 2 share voxel (x=1, y=2, z=3); point 1 is alone.
    pc = np.array([[1.5, 2.5, 3.5, 0.1],
                   [0.5, 0.5, 0.5, 0.2],
                   [1.25, 2.75, 3.25, 0.3],
                   [20.0, 0.5, 0.5, 0.4]], np.float32)  # out of range
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 3)
    voxels, indices, num, pc_voxel_id = gen.generate_voxel_with_id(torch.from_numpy(pc))
    assert indices.tolist() == [[3, 2, 1], [0, 0, 0]]  # zyx, voxels in first-point order
    assert num.tolist() == [2, 1]
    assert pc_voxel_id.tolist() == [0, 1, 0, -1]
    np.testing.assert_array_equal(voxels[0, :2].numpy(), pc[[0, 2]])  # points in point order
    assert voxels[0, 2].abs().sum() == 0 and voxels[1, 1:].abs().sum() == 0
    assert gen.grid_size == [10, 10, 10] and gen.vsize == [1.0, 1.0, 1.0]


def test_range_bounds_and_nan_dropped():
    pc = np.array([[0.0, 0.0, 0.0], [10.0, 5.0, 5.0], [9.999, 5, 5], [np.nan, 1, 1], [-1e-6, 1, 1]], np.float32)
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 3, 10, 2)
    _, indices, _, pc_voxel_id = gen.generate_voxel_with_id(torch.from_numpy(pc))
    assert pc_voxel_id.tolist() == [0, -1, 1, -1, -1]  # lower corner in, upper corner out
    assert indices.tolist() == [[0, 0, 0], [5, 5, 9]]


def test_empty_mean_is_each_voxels_own_mean():
    # Two voxels, first with values 10/20, second with 1/3. spconv's CPU build would pad the second voxel
    # with (1 + 3 + 15) / 2 (leaking the first voxel's mean 15); the right value is 2.
    pc = np.array([[0.5, 0.5, 0.5, 10.0], [0.6, 0.5, 0.5, 20.0], [5.5, 0.5, 0.5, 1.0], [5.6, 0.5, 0.5, 3.0]],
                  np.float32)
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 4)
    voxels, _, num = gen(torch.from_numpy(pc), empty_mean=True)
    assert num.tolist() == [2, 2]
    np.testing.assert_allclose(voxels[0, 2:, 3].numpy(), [15.0, 15.0])
    np.testing.assert_allclose(voxels[1, 2:, 3].numpy(), [2.0, 2.0])
    np.testing.assert_allclose(voxels[1, 2:, 0].numpy(), [5.55, 5.55], rtol=1e-6)
    # Without empty_mean the padding is zero.
    voxels, _, _ = gen(torch.from_numpy(pc))
    assert voxels[:, 2:].abs().sum() == 0


@pytest.mark.parametrize("max_points", [1, 5, 64])
def test_empty_mean_matches_reference(max_points):
    check_against_reference(random_cloud(2000, seed=3), [1, 1, 1], [0, 0, 0, 10, 10, 10], 300, max_points,
                            empty_mean=True)


def test_float64_points():
    pc = random_cloud(1000, seed=5, dtype=np.float64)
    check_against_reference(pc, [0.7, 0.9, 1.1], [0, 0, 0, 10, 10, 10], 10000, 5)


def test_empty_and_all_outside():
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 5)
    for pc in (torch.zeros(0, 4), torch.full((6, 4), 50.0)):
        voxels, indices, num, ids = gen.generate_voxel_with_id(pc, empty_mean=True)
        assert voxels.shape == (0, 5, 4) and indices.shape == (0, 3) and num.shape == (0,)
        assert ids.shape == (pc.shape[0],) and bool((ids == -1).all())


def test_deterministic_across_thread_counts():
    pc = torch.from_numpy(random_cloud(20000, seed=7))
    gen = PointToVoxel([0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], 4, 3000, 6)
    old = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        a = gen.generate_voxel_with_id(pc, empty_mean=True)
        torch.set_num_threads(max(2, old))
        b = gen.generate_voxel_with_id(pc, empty_mean=True)
    finally:
        torch.set_num_threads(old)
    for x, y in zip(a, b):
        assert torch.equal(x, y)


def test_results_are_not_overwritten_by_next_call():
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 100, 5)
    v1, i1, n1 = gen(torch.from_numpy(random_cloud(500, seed=1)))
    keep = (v1.clone(), i1.clone(), n1.clone())
    gen(torch.from_numpy(random_cloud(500, seed=2)))
    assert torch.equal(v1, keep[0]) and torch.equal(i1, keep[1]) and torch.equal(n1, keep[2])


def test_meta_data_matches_spconv_rounding():
    # OpenPCDet KITTI config: grid 1408 x 1600 x 40 (xyz) -> zyx [40, 1600, 1408].
    vsize, grid, stride, rng = calc_point2voxel_meta_data([0.05, 0.05, 0.1], [0, -40, -3, 70.4, 40, 1])
    assert grid == [40, 1600, 1408]
    assert stride == [1600 * 1408, 1408, 1]
    assert rng[:3] == [-3.0, -40.0, 0.0] and vsize[0] == pytest.approx(0.1)


def test_bad_arguments_raise():
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 5)
    with pytest.raises(ValueError, match="num_point_features"):
        gen(torch.zeros(3, 5))
    with pytest.raises(TypeError, match="points must be float32 or float64"):
        gen(torch.zeros(3, 4, dtype=torch.int32))
    with pytest.raises(ValueError, match="vsize_xyz"):
        PointToVoxel([1, 0, 1], [0, 0, 0, 10, 10, 10], 4, 10, 5)
    with pytest.raises(ValueError, match="coors_range_xyz"):
        PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10], 4, 10, 5)
    with pytest.raises(ValueError, match="grid size"):
        PointToVoxel([1, 1, 1], [0, 0, 0, 10, -10, 10], 4, 10, 5)
    with pytest.raises(ValueError, match="max_num_points_per_voxel"):
        PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 0)
    # The op itself names its arguments too.
    with pytest.raises(ValueError, match="coors_range"):
        torch.ops.spconv.point_to_voxel(torch.zeros(2, 3), [1.0] * 3, [0.0] * 5, [4, 4, 4], 10, 2, False)
    with pytest.raises(ValueError, match="grid_size"):
        torch.ops.spconv.point_to_voxel(torch.zeros(2, 3), [1.0] * 3, [0.0] * 6, [4, 0, 4], 10, 2, False)


def test_gather_features_by_pc_voxel_id():
    pc = torch.from_numpy(random_cloud(400, seed=9))
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 50, 3)
    _, indices, _, ids = gen.generate_voxel_with_id(pc)
    seg = indices.float() * 2 + 1  # per-voxel "features"
    out = gather_features_by_pc_voxel_id(seg, ids, invalid_value=-7)
    valid = ids >= 0
    assert torch.equal(out[valid], seg[ids[valid]])
    assert bool((out[~valid] == -7).all()) and bool((~valid).any())
    with pytest.raises(ValueError, match="pc_voxel_id"):
        gather_features_by_pc_voxel_id(seg, torch.tensor([seg.shape[0]]))


def test_opcheck_point_to_voxel():
    pc = torch.from_numpy(random_cloud(300, seed=11))
    for empty_mean in (False, True):
        torch.library.opcheck(torch.ops.spconv.point_to_voxel.default,
                              (pc, [1.0, 1.0, 1.0], [0.0, 0.0, 0.0, 10.0, 10.0, 10.0], [10, 10, 10], 50, 3,
                               empty_mean))


def _tensorview_from_numpy(arr):
    # The real cumm where installed, else spconv's stand-in (import spconv installed its finder).
    import cumm.tensorview as tv
    return tv.from_numpy(arr)


class _OpenPCDetVoxelGeneratorWrapper:
    """OpenPCDet's VoxelGeneratorWrapper, spconv 2.x branch (pcdet/datasets/processor/data_processor.py)."""

    def __init__(self, vsize_xyz, coors_range_xyz, num_point_features, max_num_points_per_voxel, max_num_voxels):
        import spconv.utils as su
        assert not hasattr(su, "VoxelGeneratorV2") and not hasattr(su, "VoxelGenerator")  # else pcdet takes 1.x path
        self._voxel_generator = su.Point2VoxelCPU3d(
            vsize_xyz=vsize_xyz, coors_range_xyz=coors_range_xyz, num_point_features=num_point_features,
            max_num_points_per_voxel=max_num_points_per_voxel, max_num_voxels=max_num_voxels)

    def generate(self, points):
        tv_voxels, tv_coordinates, tv_num_points = self._voxel_generator.point_to_voxel(
            _tensorview_from_numpy(points))
        return tv_voxels.numpy(), tv_coordinates.numpy(), tv_num_points.numpy()


def test_point2voxel_cpu3d_as_openpcdet_calls_it():
    vsize, rng = [0.5, 0.5, 0.25], [0, -5, -1, 10, 5, 3]
    wrapper = _OpenPCDetVoxelGeneratorWrapper(vsize, rng, 4, 5, 2000)
    pc = np.random.default_rng(13).uniform([-1, -6, -2, 0], [11, 6, 4, 1], size=(5000, 4)).astype(np.float32)
    voxels, coords, num_points = wrapper.generate(pc)
    rv, ri, rn, _ = reference(pc, vsize, rng, 2000, 5)
    assert isinstance(voxels, np.ndarray) and voxels.dtype == np.float32 and coords.dtype == np.int32
    np.testing.assert_array_equal(coords, ri)
    np.testing.assert_array_equal(num_points, rn)
    np.testing.assert_array_equal(voxels, rv)
    # .numpy() results are copies: a second call leaves them alone.
    snapshot = voxels.copy()
    wrapper.generate(pc[::-1].copy())
    np.testing.assert_array_equal(voxels, snapshot)
    assert wrapper._voxel_generator.grid_size == [16, 20, 20]


def test_point2voxel_accepts_numpy_torch_and_other_ndims():
    pc = random_cloud(600, c=4, seed=17)
    gen = Point2VoxelCPU3d([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 100, 4)
    a = gen.point_to_voxel(pc)
    b = gen.point_to_voxel(torch.from_numpy(pc))
    c = gen.point_to_voxel_empty_mean(pc)
    import cumm.tensorview as tv
    assert all(isinstance(x, tv.Tensor) for x in a)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x.numpy(), y.numpy())
    rv = reference(pc, [1, 1, 1], [0, 0, 0, 10, 10, 10], 100, 4, empty_mean=True)[0]
    np.testing.assert_allclose(c[0].numpy(), rv, rtol=1e-6)
    assert a[1].shape == [a[0].dim(0), 3] and a[2].ndim == 1
    g1 = Point2VoxelCPU1d([1], [0, 10], 4, 100, 4)
    assert g1.point_to_voxel(pc)[1].shape[1] == 1
    g4 = Point2VoxelCPU4d([1, 1, 1, 1], [0, 0, 0, 0, 10, 10, 10, 10], 4, 100, 4)
    np.testing.assert_array_equal(g4.point_to_voxel(pc)[1].numpy(),
                                  reference(pc, [1] * 4, [0] * 4 + [10] * 4, 100, 4)[1])
    with pytest.raises(ValueError, match="3 voxel sizes"):
        Point2VoxelCPU3d([1, 1], [0, 0, 10, 10], 4, 100, 4)
    with pytest.raises(TypeError, match="points must be"):
        gen.point_to_voxel([[1.0, 2.0, 3.0, 4.0]])


@needs_gpu
@pytest.mark.parametrize("empty_mean", [False, True])
@pytest.mark.parametrize("max_voxels,max_points", [(100000, 32), (50, 2)])
def test_gpu_matches_cpu_and_reference(empty_mean, max_voxels, max_points):
    pc = random_cloud(20000, seed=21)
    check_against_reference(pc, [0.5, 0.5, 0.5], [0, 0, 0, 10, 10, 10], max_voxels, max_points, empty_mean,
                            device="cuda")


@needs_gpu
def test_gpu_empty_float64_and_point2voxel_gpu():
    from spconv.utils import Point2VoxelGPU3d
    gen = PointToVoxel([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 10, 5, device=torch.device("cuda"))
    voxels, indices, num = gen(torch.zeros(0, 4, device="cuda"))
    assert voxels.shape == (0, 5, 4) and indices.shape == (0, 3)
    check_against_reference(random_cloud(3000, seed=23, dtype=np.float64), [0.7, 0.9, 1.1],
                            [0, 0, 0, 10, 10, 10], 10000, 5, True, device="cuda")
    pc = random_cloud(3000, seed=25)
    g = Point2VoxelGPU3d([1, 1, 1], [0, 0, 0, 10, 10, 10], 4, 500, 5)
    res = g.point_to_voxel_hash(pc, empty_mean=True)
    ref = reference(pc, [1, 1, 1], [0, 0, 0, 10, 10, 10], 500, 5, empty_mean=True)
    np.testing.assert_array_equal(res[1].numpy(), ref[1])
    np.testing.assert_allclose(res[0].numpy(), ref[0], rtol=1e-6)
    torch.library.opcheck(torch.ops.spconv.point_to_voxel.default,
                          (torch.from_numpy(pc).cuda(), [1.0] * 3, [0.0] * 3 + [10.0] * 3, [10, 10, 10], 50, 3, True))
