"""The native CPU conv backward's two routes (one pass over blocks of input rows with per-group dW partials
for large inputs, with the fused kernels or the vendor GEMM; dX and a split-K dW pass separately otherwise):
each matches a reference and gives the same bits on 1 and 2 threads."""
import pytest
import torch

import spconv.pytorch  # noqa: F401  (loads the ops)
from spconv.pytorch.core import MAP_MIRRORED, MAP_REPEAT_FREE

ops = torch.ops.spconv


def _voxels(shape, n, seed):
    g = torch.Generator().manual_seed(seed)
    flat = torch.randperm(shape[0] * shape[1] * shape[2], generator=g)[:n]
    z, rem = flat // (shape[1] * shape[2]), flat % (shape[1] * shape[2])
    return torch.stack([torch.zeros_like(flat), z, rem // shape[2], rem % shape[2]], 1).int()


def _reference(x, w, dy, pin, pout, poff):
    x, w, dy = x.double(), w.double(), dy.double()
    dx = torch.zeros_like(x)
    dw = torch.zeros_like(w)
    for k in range(w.shape[0]):
        i, o = pin[poff[k]:poff[k + 1]].long(), pout[poff[k]:poff[k + 1]].long()
        dx.index_add_(0, i, dy[o] @ w[k].t())
        dw[k] = x[i].t() @ dy[o]
    return dx, dw


def _backward(x, w, dy, pin, pout, poff, threads):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return ops.indice_conv_backward(x, w, dy, pin, pout, poff)
    finally:
        torch.set_num_threads(saved)


# large_subm_fused: X and dY of 18 MB, past the separate passes' 16 MB: the row blocks with the fused kernels (on
# AVX2 and AVX-512 CPUs). large_subm_vendor: ~150k pairs, 20 output channels (no fused dW kernel): the row
# blocks with the vendor GEMM. small and strided: the separate route.
CASES = {
    "large_subm_fused": dict(shape=[40, 40, 40], n=36000, subm=True, c_in=64, c_out=64),
    "large_subm_vendor": dict(shape=[30, 30, 30], n=12000, subm=True, c_in=16, c_out=20),
    "small_subm": dict(shape=[16, 16, 16], n=800, subm=True, c_in=32, c_out=40),
    "strided": dict(shape=[20, 20, 20], n=2000, subm=False, c_in=24, c_out=16),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("case", sorted(CASES))
def test_backward_routes(case, dtype):
    p = CASES[case]
    ind = _voxels(p["shape"], p["n"], seed=3)
    if p["subm"]:
        _, pin, pout, poff, _, _ = ops.get_indice_pairs(ind, 1, p["shape"], p["shape"], [3, 3, 3], [1, 1, 1], [1, 1, 1],
                                                  [1, 1, 1], True, False)
        n_out = p["n"]
    else:
        out_shape = [(s - 1) // 2 + 1 for s in p["shape"]]
        out_ind, pin, pout, poff, _, _ = ops.get_indice_pairs(ind, 1, p["shape"], out_shape, [3, 3, 3], [2, 2, 2],
                                                        [1, 1, 1], [1, 1, 1], False, False)
        n_out = out_ind.shape[0]
    g = torch.Generator().manual_seed(0)
    x = torch.randn(p["n"], p["c_in"], generator=g, dtype=dtype)
    w = torch.randn(27, p["c_in"], p["c_out"], generator=g, dtype=dtype)
    dy = torch.randn(n_out, p["c_out"], generator=g, dtype=dtype)
    dx1, dw1 = _backward(x, w, dy, pin, pout, poff, 1)
    dx2, dw2 = _backward(x, w, dy, pin, pout, poff, 2)
    assert torch.equal(dx1, dx2) and torch.equal(dw1, dw2)
    rdx, rdw = _reference(x, w, dy, pin, pout, poff)
    tol = 1e-4 if dtype == torch.float32 else 1e-10
    torch.testing.assert_close(dx1.double(), rdx, atol=tol * rdx.abs().max().item(), rtol=tol)
    torch.testing.assert_close(dw1.double(), rdw, atol=tol * rdw.abs().max().item(), rtol=tol)


def _subm_pairs(ind, shape, ksize):
    pad = [k // 2 for k in ksize]
    return ops.get_indice_pairs(ind, 1, shape, shape, ksize, [1, 1, 1], pad, [1, 1, 1], True, False)


def test_map_info_says_which_maps_are_mirrored():
    ind = _voxels([12, 12, 12], 500, seed=4)
    assert _subm_pairs(ind, [12, 12, 12], [3, 3, 3])[4][-1].item() == MAP_REPEAT_FREE | MAP_MIRRORED
    assert _subm_pairs(ind, [12, 12, 12], [3, 1, 5])[4][-1].item() == MAP_REPEAT_FREE | MAP_MIRRORED
    assert _subm_pairs(ind, [12, 12, 12], [3, 2, 3])[4][-1].item() == MAP_REPEAT_FREE  # an even size: no mirror
    strided = ops.get_indice_pairs(ind, 1, [12, 12, 12], [6, 6, 6], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1],
                                   False, False)
    assert strided[4][-1].item() == MAP_REPEAT_FREE
    # The mirror, checked: offset k's pairs are offset kvol - 1 - k's with the sides swapped.
    _, pin, pout, poff, _, _ = _subm_pairs(ind, [12, 12, 12], [3, 1, 5])
    kvol = poff.numel() - 1
    for k in range(kvol):
        m = kvol - 1 - k
        a = set(zip(pin[poff[k]:poff[k + 1]].tolist(), pout[poff[k]:poff[k + 1]].tolist()))
        b = set(zip(pout[poff[m]:poff[m + 1]].tolist(), pin[poff[m]:poff[m + 1]].tolist()))
        assert a == b, k


@pytest.mark.parametrize("case", ["large_subm_fused", "large_subm_vendor", "small_subm"])
def test_mirrored_map_backward(case):
    """With the map's record (mirrored), an offset whose input rows don't ascend takes its mirror's pairs instead
    of a copy. dX sums the same products in the same order (same bits); in the row-block route dW sums a bucket's
    pairs by input row instead of by output row (FP32 rounding, still the same bits for 1 and 2 threads)."""
    p = CASES[case]
    ind = _voxels(p["shape"], p["n"], seed=3)  # rows in random order: the input side of every offset is unsorted
    _, pin, pout, poff, info, _ = _subm_pairs(ind, p["shape"], [3, 3, 3])
    g = torch.Generator().manual_seed(0)
    x = torch.randn(p["n"], p["c_in"], generator=g)
    w = torch.randn(27, p["c_in"], p["c_out"], generator=g)
    dy = torch.randn(p["n"], p["c_out"], generator=g)
    plain = _backward(x, w, dy, pin, pout, poff, 2)
    saved = torch.get_num_threads()
    runs = []
    for threads in (1, 2):
        torch.set_num_threads(threads)
        try:
            runs.append(ops.indice_conv_backward(x, w, dy, pin, pout, poff, info))
        finally:
            torch.set_num_threads(saved)
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    dx, dw = runs[0]
    assert torch.equal(dx, plain[0])
    rdx, rdw = _reference(x, w, dy, pin, pout, poff)
    assert ((dw.double() - rdw).norm() / rdw.norm()).item() < 1e-5
    if case == "small_subm":  # the separate route: dW does not go through the row blocks
        assert torch.equal(dw, plain[1])
