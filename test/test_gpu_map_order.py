"""The GPU kernel-map builder numbers regular / transposed conv (and pool) outputs in the CPU route's order
(first-seen: inputs by coordinate, offsets ascending), so a model gives the same rows on either device."""
import pytest
import torch

import spconv._backend  # noqa: F401
from support.sites import coords

ops = torch.ops.spconv


CASES = {
    "conv_s2": dict(shape=[9, 8, 7], ksize=3, stride=2, padding=1, transpose=False),
    "conv_k2s2": dict(shape=[8, 8, 8], ksize=2, stride=2, padding=0, transpose=False),
    "deconv": dict(shape=[5, 4, 6], ksize=3, stride=2, padding=1, transpose=True),
    "conv_2d_dups": dict(shape=[20, 20], ksize=3, stride=1, padding=1, transpose=False, dups=30),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_outputs_in_cpu_order(name, gpu_place):
    """Before: the GPU numbered outputs by sorted key (out_indices and every pair_out differed)."""
    c = dict(CASES[name])
    shape, k, s, p, tr = c["shape"], c["ksize"], c["stride"], c["padding"], c["transpose"]
    nd = len(shape)
    if tr:
        out_shape = [(v - 1) * s - 2 * p + k for v in shape]
    else:
        out_shape = [(v + 2 * p - (k - 1) - 1) // s + 1 for v in shape]
    idx = coords(shape, 2, 150, seed=len(name), dups=c.get("dups", 0))
    args = (idx, 2, shape, out_shape, [k] * nd, [s] * nd, [p] * nd, [1] * nd, False, tr)
    ref = ops.get_indice_pairs(*args)
    got = gpu_place.ops.get_indice_pairs(gpu_place.to(idx), *args[1:])
    for a, b in zip(got, ref):
        assert torch.equal(a.cpu(), b)
