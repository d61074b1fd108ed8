"""Benchmark inputs: a synthetic LiDAR-like scan, voxelization, real-scan files, crops.

The synthetic scan ray-casts a spinning multi-beam sensor against a ground plane and a few boxes (cars,
walls, buildings), so the voxels have the structure of a real sweep: dense rings near the sensor, sparse far
away, vertical surfaces on objects. Everything is seeded, so a run is reproducible on any machine.
"""
import functools
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

import numpy as np

# spconv's bench_basic grid: 0.1 m voxels over [-80, 80] x [-80, 80] x [-2, 6] -> spatial shape [80, 1600, 1600].
DEFAULT_RANGE = (-80.0, -80.0, -2.0, 80.0, 80.0, 6.0)
DEFAULT_VSIZE = (0.1, 0.1, 0.1)


@dataclass(frozen=True)
class Scanner:
    """A spinning multi-beam LiDAR at the origin."""

    beams: int = 128
    azimuth_steps: int = 3200
    elevation_deg: Tuple[float, float] = (-25.0, 15.0)
    height_m: float = 1.73  # above the ground plane
    max_range_m: float = 90.0
    range_noise_m: float = 0.02


@dataclass(frozen=True)
class Grid:
    """Voxelization parameters: metric range (xmin, ymin, zmin, xmax, ymax, zmax) and voxel size (x, y, z)."""

    coors_range: Tuple[float, ...] = DEFAULT_RANGE
    vsize: Tuple[float, ...] = DEFAULT_VSIZE

    @property
    def spatial_shape(self) -> Tuple[int, int, int]:
        """[z, y, x] like spconv's indices."""
        r, v = np.asarray(self.coors_range), np.asarray(self.vsize)
        xyz = np.round((r[3:] - r[:3]) / v).astype(int)
        return int(xyz[2]), int(xyz[1]), int(xyz[0])


DEFAULT_SCANNER = Scanner()
DEFAULT_GRID = Grid()
# --quick: fewer beams and coarser voxels (still >= 64 cells per axis: the basic network halves it six times).
QUICK_SCANNER = Scanner(beams=32, azimuth_steps=800, max_range_m=45.0)
QUICK_GRID = Grid(coors_range=(-40.0, -40.0, -2.0, 40.0, 40.0, 6.0), vsize=(0.2, 0.2, 0.125))


def street_boxes(rng: np.random.Generator, length_m: float) -> np.ndarray:
    """Axis-aligned boxes [B, 6] (xmin, ymin, zmin, xmax, ymax, zmax) of a street along x, standing on the ground
    (z = 0): building blocks on both sides, parked cars, poles. The sensor stands in the middle of the road."""
    boxes = []
    for side in (-1.0, 1.0):
        x = -length_m
        while x < length_m:  # building blocks with gaps between them
            size = rng.uniform(8.0, 30.0)
            front = rng.uniform(9.0, 16.0)
            depth, height = rng.uniform(6.0, 14.0), rng.uniform(4.0, 14.0)
            y0, y1 = sorted((side * front, side * (front + depth)))
            boxes.append([x, y0, 0.0, x + size, y1, height])
            x += size + rng.uniform(2.0, 10.0)
        for x in rng.uniform(-length_m * 0.8, length_m * 0.8, size=12):  # parked cars
            if abs(x) < 6.0:
                continue
            y = side * rng.uniform(3.5, 5.5)
            boxes.append([x - 2.2, y - 0.9, 0.0, x + 2.2, y + 0.9, rng.uniform(1.4, 1.9)])
        for x in rng.uniform(-length_m * 0.8, length_m * 0.8, size=10):  # poles and tree trunks
            y = side * rng.uniform(7.0, 8.5)
            boxes.append([x - 0.2, y - 0.2, 0.0, x + 0.2, y + 0.2, rng.uniform(3.0, 7.0)])
    return np.asarray(boxes, np.float64)


def beam_elevations(scanner: "Scanner") -> np.ndarray:
    """Like a multi-beam sensor: half of the beams packed in the upper third of the field of view, where rays
    travel far, the other half spread over the steep lower part."""
    lo, hi = scanner.elevation_deg
    split = hi - (hi - lo) / 3
    upper = np.linspace(hi, split, scanner.beams // 2, endpoint=False)
    lower = np.linspace(split, lo, scanner.beams - scanner.beams // 2)
    return np.deg2rad(np.concatenate([upper, lower]))


def _azimuth_slices(box: np.ndarray, steps: int):
    """Azimuth-index ranges [(i0, i1)] whose rays can hit ``box``: testing only those keeps ray casting fast."""
    xs, ys = box[[0, 3]], box[[1, 4]]
    if xs[0] <= 0 <= xs[1] and ys[0] <= 0 <= ys[1]:
        return [(0, steps)]
    ang = np.sort([np.arctan2(y, x) for x in xs for y in ys])
    step = 2 * np.pi / steps
    to_index = lambda a: int(np.clip((a + np.pi) / step, 0, steps))  # noqa: E731
    if ang[-1] - ang[0] > np.pi:  # straddles the -x axis where the angle wraps
        neg, pos = ang[ang < 0], ang[ang >= 0]
        return [(0, to_index(neg.max()) + 2), (max(to_index(pos.min()) - 1, 0), steps)]
    return [(max(to_index(ang[0]) - 1, 0), min(to_index(ang[-1]) + 2, steps))]


def scan_points(scanner: Scanner = DEFAULT_SCANNER, seed: int = 0) -> np.ndarray:
    """One sweep as float32 points [N, 3] (x, y, z in metres, sensor at the origin)."""
    rng = np.random.default_rng(seed)
    elev = beam_elevations(scanner)
    azim = np.linspace(-np.pi, np.pi, scanner.azimuth_steps, endpoint=False)
    az, el = np.meshgrid(azim, elev, indexing="ij")  # azimuth-major: a box's rays are contiguous
    d = np.stack([np.cos(el) * np.cos(az), np.cos(el) * np.sin(az), np.sin(el)], -1).reshape(-1, 3)
    origin = np.array([0.0, 0.0, scanner.height_m])  # ray-cast in a frame with the ground at z = 0
    t = np.full(d.shape[0], np.inf)
    down = d[:, 2] < -1e-6
    t[down] = -origin[2] / d[down, 2]
    beams = scanner.beams
    with np.errstate(divide="ignore", invalid="ignore"):
        inv = 1.0 / d
        for b in street_boxes(rng, scanner.max_range_m):  # slab test on the rays that can reach the box
            for a0, a1 in _azimuth_slices(b, scanner.azimuth_steps):
                s = slice(a0 * beams, a1 * beams)
                t0 = (b[:3] - origin) * inv[s]
                t1 = (b[3:] - origin) * inv[s]
                near = np.nanmax(np.minimum(t0, t1), axis=1)
                far = np.nanmin(np.maximum(t0, t1), axis=1)
                hit = (near <= far) & (near > 0) & (near < t[s])
                t[s] = np.where(hit, near, t[s])
    keep = t < scanner.max_range_m
    t = t[keep] + rng.normal(0.0, scanner.range_noise_m, size=int(keep.sum()))
    pts = origin + d[keep] * t[:, None]
    pts[:, 2] -= scanner.height_m  # back to the sensor frame (like KITTI: ground at about -1.73 m)
    return pts.astype(np.float32)


def voxelize(points: np.ndarray, grid: Grid = DEFAULT_GRID, batch: int = 0):
    """Points [N, >=3] -> (features [M, 3] mean xyz per voxel, indices int32 [M, 4] (batch, z, y, x), shape).

    A plain NumPy voxelizer for the synthetic default scenes (the ``large`` workload with ``--points`` uses the
    project's PointToVoxel instead). Voxels come out sorted by (z, y, x).
    """
    r, v = np.asarray(grid.coors_range, np.float64), np.asarray(grid.vsize, np.float64)
    shape = grid.spatial_shape
    xyz = points[:, :3].astype(np.float64)
    c = np.floor((xyz - r[:3]) / v).astype(np.int64)
    ok = np.all((c >= 0) & (c < np.array(shape[::-1])), axis=1)
    c, xyz = c[ok], xyz[ok]
    key = (c[:, 2] * shape[1] + c[:, 1]) * shape[2] + c[:, 0]
    uniq, inv = np.unique(key, return_inverse=True)
    count = np.bincount(inv, minlength=uniq.size)[:, None]
    feats = np.stack([np.bincount(inv, weights=xyz[:, k], minlength=uniq.size) for k in range(3)], 1) / count
    zyx = np.stack([uniq // (shape[1] * shape[2]), (uniq // shape[2]) % shape[1], uniq % shape[2]], 1)
    indices = np.concatenate([np.full((uniq.size, 1), batch), zyx], 1).astype(np.int32)
    return feats.astype(np.float32), indices, list(shape)


def replicate_sweep(points: np.ndarray, copies: int = 8, shift_m: float = 1.0, axis: int = 1) -> np.ndarray:
    """spconv's bench_large input: the sweep stacked ``copies`` times, copy k shifted by k * shift_m along y."""
    out = []
    for k in range(copies):
        p = points.copy()
        p[:, axis] += k * shift_m
        out.append(p)
    return np.concatenate(out, 0)


def synthetic_scan(quick: bool = False, seed: int = 0):
    """The default ``basic`` input: (features, indices, spatial_shape)."""
    return voxelize(synthetic_points(quick, seed), QUICK_GRID if quick else DEFAULT_GRID)


@functools.lru_cache(maxsize=4)
def synthetic_points(quick: bool = False, seed: int = 0) -> np.ndarray:
    """The default sweep (cached: several workloads start from it; callers must not modify it)."""
    return scan_points(QUICK_SCANNER if quick else DEFAULT_SCANNER, seed)


def load_voxels_npz(path: str):
    """A voxelized scan saved as ``features`` [N, C], ``indices`` int32 [N, 4] (batch, z, y, x), ``spatial_shape``."""
    with np.load(path) as d:
        missing = {"features", "indices", "spatial_shape"} - set(d.files)
        if missing:
            raise ValueError(f"{path}: missing arrays {sorted(missing)} (has {d.files})")
        feats = np.ascontiguousarray(d["features"], dtype=np.float32)
        idx = np.ascontiguousarray(d["indices"], dtype=np.int32)
        shape = [int(s) for s in d["spatial_shape"]]
    if idx.ndim != 2 or idx.shape[1] != 4 or feats.shape[0] != idx.shape[0]:
        raise ValueError(f"{path}: expected indices [N, 4] and features [N, C], got {idx.shape} and {feats.shape}")
    return feats, idx, shape


def load_points_npz(path: str) -> np.ndarray:
    """A raw sweep saved as ``pc`` float32 [N, >=3] (x, y, z in metres)."""
    with np.load(path) as d:
        if "pc" not in d.files:
            raise ValueError(f"{path}: expected an array named 'pc', has {d.files}")
        return np.ascontiguousarray(d["pc"], dtype=np.float32)


def nearest_voxels(indices: np.ndarray, n: int, centre: Optional[Sequence[int]] = None) -> np.ndarray:
    """Row numbers of the ``n`` voxels closest to ``centre`` (default: the grid centre, i.e. the sensor).

    A contiguous chunk of a scan keeps the neighbourhood structure of real data, unlike a random subsample.
    """
    zyx = indices[:, 1:].astype(np.float64)
    if centre is None:
        centre = zyx.max(0) / 2 if len(zyx) else np.zeros(3)
    dist = np.square(zyx - np.asarray(centre, np.float64)).sum(1)
    return np.sort(np.argsort(dist, kind="stable")[:n])


def lidar_voxels(n: int, quick: bool = False, seed: int = 0):
    """About ``n`` voxels of LiDAR-like structure on the default grid (sweeps stacked bench_large-style if
    one sweep is not enough), for the single-layer and kernel-map sweeps."""
    grid = QUICK_GRID if quick else DEFAULT_GRID
    pts = synthetic_points(quick, seed)
    feats, idx, shape = voxelize(pts, grid)
    copies = 1
    while idx.shape[0] < n and copies < 64:
        copies *= 2
        feats, idx, shape = voxelize(replicate_sweep(pts, copies, 1.0), grid)
    rows = nearest_voxels(idx, n)
    return feats[rows], idx[rows], shape


def crop_window(indices: np.ndarray, size: Sequence[int], candidates: int = 64, seed: int = 0) -> np.ndarray:
    """Origin (z, y, x) of a ``size`` window holding many voxels: the best of ``candidates`` windows placed on
    voxels of the scan (a window on empty space would check nothing)."""
    zyx = indices[:, 1:]
    if len(zyx) == 0:
        return np.zeros(3, np.int64)
    rng = np.random.default_rng(seed)
    size = np.asarray(size)
    picks = zyx[rng.choice(len(zyx), size=min(candidates, len(zyx)), replace=False)]
    best, best_count = None, -1
    for p in picks:
        lo = np.maximum(p - size // 2, 0)
        count = int(np.all((zyx >= lo) & (zyx < lo + size), axis=1).sum())
        if count > best_count:
            best, best_count = lo, count
    return best


def crop(features: np.ndarray, indices: np.ndarray, origin: Sequence[int], size: Sequence[int]):
    """The voxels inside the window, re-indexed so the window is the whole grid: (features, indices, shape)."""
    origin, size = np.asarray(origin), np.asarray(size)
    zyx = indices[:, 1:]
    inside = np.all((zyx >= origin) & (zyx < origin + size), axis=1)
    idx = indices[inside].copy()
    idx[:, 1:] -= origin.astype(idx.dtype)
    return features[inside], idx, [int(s) for s in size]
