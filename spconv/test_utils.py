"""spconv 2.x's ``spconv.test_utils``: the helpers its own tests (and some users' tests) import.

``generate_sparse_data`` returns indices as ``[N, ndim + 1]`` with the batch index in the *last* column, as
spconv's does (its tests move it to the front before building a SparseConvTensor).
"""
import itertools
import unittest
from typing import Dict, Sequence

import numpy as np


class TestCase(unittest.TestCase):
    """unittest.TestCase with numpy array comparisons (accepts arrays, torch tensors, lists, scalars)."""

    @staticmethod
    def _as_array(a) -> np.ndarray:
        if hasattr(a, "detach"):  # torch tensor, on any device
            a = a.detach().cpu().numpy()
        return np.asarray(a)

    def assertAllEqual(self, a, b):
        a, b = self._as_array(a), self._as_array(b)
        self.assertEqual(a.shape, b.shape, f"shape mismatch: {a.shape} vs {b.shape}")
        np.testing.assert_array_equal(a, b)

    def assertAllClose(self, a, b, rtol=1e-6, atol=1e-6, msg: str = ""):
        a, b = self._as_array(a), self._as_array(b)
        self.assertEqual(a.shape, b.shape, f"shape mismatch: {a.shape} vs {b.shape}. {msg}")
        np.testing.assert_allclose(a, b, rtol=rtol, atol=atol, err_msg=msg)


def params_grid(*params: Sequence):
    """Every combination of the given value lists, the last list varying fastest, as a list of lists."""
    return [list(combo) for combo in itertools.product(*params)]


def generate_sparse_data(shape, num_points, num_channels, integer=False, data_range=(-1, 1), with_dense=True,
                         dtype=np.float32, shape_scale=1) -> Dict[str, np.ndarray]:
    """Random sparse data: ``num_points[b]`` distinct sites per batch entry ``b`` on a grid of ``shape`` (sites on
    multiples of ``shape_scale``), uniform features in ``data_range`` (integers with ``integer=True``).

    Returns ``features [N, C]``, ``indices [N, ndim + 1]`` int32 (batch index last) and, with ``with_dense``,
    ``features_dense [B, C, *shape]``. Draws from numpy's global random state (``np.random.seed`` repeats it).
    """
    shape = [int(s) for s in shape]
    num_points = np.atleast_1d(np.asarray(num_points, dtype=np.int64))
    if int(shape_scale) < 1:
        raise ValueError(f"shape_scale must be >= 1, got {shape_scale}")
    grid = np.stack(np.meshgrid(*[np.arange(0, s // shape_scale) for s in shape], indexing="ij"), axis=-1)
    grid = grid.reshape(-1, len(shape)) * shape_scale
    if (num_points > len(grid)).any():
        raise ValueError(f"num_points {num_points.tolist()} exceeds the {len(grid)} sites of the grid")
    per_batch = []
    for b, n in enumerate(num_points):
        sites = grid[np.random.permutation(len(grid))[:n]]
        per_batch.append(np.concatenate([sites, np.full((n, 1), b, dtype=sites.dtype)], axis=1))
    indices = np.concatenate(per_batch, axis=0).astype(np.int32)
    size = [int(num_points.sum()), int(num_channels)]
    if integer:
        features = np.random.randint(data_range[0], data_range[1], size=size).astype(dtype)
    else:
        features = np.random.uniform(data_range[0], data_range[1], size=size).astype(dtype)
    res = {"features": features}
    if with_dense:
        dense = np.zeros([len(num_points), int(num_channels), *shape], dtype=features.dtype)
        dense[(indices[:, -1], slice(None), *indices[:, :-1].T)] = features
        res["features_dense"] = dense
    res["indices"] = indices
    return res
