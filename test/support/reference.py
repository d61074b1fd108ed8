"""Dense references for sparse layers: F.conv*/conv_transpose* on the densified tensor (1-3D) and a
vectorised brute force over (site, kernel offset) candidates (any dimension, used for 4D)."""
import itertools
from typing import List, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

import spconv.pytorch as spconv


def random_sparse(ndim: int, shape: Sequence[int], batch_size: int, channels: int, density: float = 0.3,
                  dtype=torch.float32, seed: int = 0, min_sites: int = 1) -> spconv.SparseConvTensor:
    """Unique random coordinates (at least ``min_sites``) with random features."""
    g = torch.Generator().manual_seed(seed)
    volume = batch_size * int(np.prod(shape))
    n = max(min_sites, int(volume * density))
    n = min(n, volume)
    flat = torch.randperm(volume, generator=g)[:n]
    coords = []
    rest = flat
    for s in reversed(list(shape)):
        coords.append(rest % s)
        rest = rest // s
    coords.append(rest)
    indices = torch.stack(coords[::-1], dim=1).int()
    features = torch.randn(n, channels, generator=g, dtype=torch.float64).to(dtype)
    return spconv.SparseConvTensor(features, indices, list(shape), batch_size)


def dense_weight(weight: torch.Tensor) -> torch.Tensor:
    """[Cout, *k, Cin] -> F.convNd layout [Cout, Cin, *k]."""
    nd = weight.dim() - 2
    return weight.permute(0, nd + 1, *range(1, nd + 1))


def conv1x1_weight(weight: torch.Tensor) -> torch.Tensor:
    """spconv 2.x computes a kernel-volume-1 conv as features @ weight.view(Cin, Cout) (a reinterpretation)."""
    cout, cin = weight.shape[0], weight.shape[-1]
    return weight.reshape(cin, cout).t().reshape(weight.shape)


_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DECONV = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def gather_sites(dense: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """[B, C, *spatial] read at indices [N, 1 + ndim] -> [N, C]."""
    idx = indices.long()
    return dense.movedim(1, -1)[tuple(idx.t())]


def dense_reference(kind: str, x: spconv.SparseConvTensor, weight: torch.Tensor, out_indices: torch.Tensor,
                    out_shape: List[int], stride, padding, dilation, bias: Optional[torch.Tensor] = None):
    """Features at ``out_indices`` of the dense equivalent of a sparse layer. kind: subm, conv, deconv, inverse
    (an inverse conv is the transposed conv of the conv it undoes, read at that conv's input sites)."""
    nd = len(x.spatial_shape)
    xd = x.dense()
    w = dense_weight(weight)
    if kind == "subm":
        pad = [(k // 2) * d for k, d in zip(weight.shape[1:-1], dilation)]
        y = _CONV[nd](xd, w, None, 1, pad, dilation)
    elif kind == "conv":
        y = _CONV[nd](xd, w, None, stride, padding, dilation)
    else:
        # output_padding recovers the far border that torch's transposed conv would otherwise drop.
        natural = [(i - 1) * s_ - 2 * p_ + d_ * (k - 1) + 1
                   for i, s_, p_, d_, k in zip(x.spatial_shape, stride, padding, dilation, weight.shape[1:-1])]
        out_pad = [max(0, min(o - n_, max(s_, d_) - 1)) for o, n_, s_, d_ in zip(out_shape, natural, stride, dilation)]
        y = _DECONV[nd](xd, w.transpose(0, 1).contiguous(), None, stride, padding, out_pad, 1, dilation)
    # Crop or zero-pad to the sparse layer's output shape (spconv's transposed formula ignores dilation).
    full = torch.zeros(y.shape[:2] + tuple(out_shape), dtype=y.dtype)
    region = tuple(slice(0, min(a, b)) for a, b in zip(y.shape[2:], out_shape))
    full[(slice(None), slice(None)) + region] = y[(slice(None), slice(None)) + region]
    out = gather_sites(full, out_indices)
    return out if bias is None else out + bias


def brute_force(kind: str, x: spconv.SparseConvTensor, weight: torch.Tensor, out_indices: torch.Tensor,
                out_shape: List[int], stride, padding, dilation):
    """Any-dimensional reference: enumerate every (input site, kernel offset) and accumulate."""
    nd = len(x.spatial_shape)
    ksize = list(weight.shape[1:-1])
    offsets = torch.tensor(list(itertools.product(*[range(k) for k in ksize])), dtype=torch.long)  # [K, nd]
    coords = x.indices[:, 1:].long()
    s, p, d = (torch.tensor(v, dtype=torch.long) for v in (stride, padding, dilation))
    shape = torch.tensor(out_shape, dtype=torch.long)
    if kind == "subm":
        # out o takes in at o + (k - ksize//2) d: the input site i feeds o = i - (k - ksize//2) d.
        cand = coords[:, None, :] - (offsets[None] - torch.tensor(ksize)[None, None] // 2) * d
        valid = torch.ones(cand.shape[:2], dtype=torch.bool)
    elif kind == "conv":
        num = coords[:, None, :] + p - offsets[None] * d
        valid = ((num >= 0) & (num % s == 0)).all(-1)
        cand = torch.div(num, s, rounding_mode="floor")
    else:  # deconv, or inverse (the deconv relation restricted to the stored sites)
        cand = coords[:, None, :] * s - p + offsets[None] * d
        valid = torch.ones(cand.shape[:2], dtype=torch.bool)
    valid &= ((cand >= 0) & (cand < shape)).all(-1)
    # Row of every output coordinate.
    strides = torch.tensor([int(np.prod(out_shape[i + 1:])) for i in range(nd)], dtype=torch.long)
    vol = int(np.prod(out_shape))
    key_of = lambda b, c: b * vol + (c * strides).sum(-1)  # noqa: E731
    out_keys = key_of(out_indices[:, 0].long(), out_indices[:, 1:].long())
    row = {int(k): r for r, k in enumerate(out_keys.tolist())}
    i_idx, k_idx = valid.nonzero(as_tuple=True)
    keys = key_of(x.indices[i_idx, 0].long(), cand[i_idx, k_idx])
    if kind in ("subm", "inverse"):
        present = torch.tensor([int(k) in row for k in keys.tolist()], dtype=torch.bool)
        i_idx, k_idx, keys = i_idx[present], k_idx[present], keys[present]
    missing = set(keys.tolist()) - set(row)
    assert not missing, f"brute force finds output sites the layer lacks: {sorted(missing)[:5]}"
    if kind in ("conv", "deconv"):
        assert len(row) == len(set(keys.tolist())), "the layer has output sites no input reaches"
    rows = torch.tensor([row[int(k)] for k in keys.tolist()], dtype=torch.long)
    wk = weight.reshape(weight.shape[0], -1, weight.shape[-1])  # [Cout, K, Cin]
    contrib = torch.einsum("nc,noc->no", x.features[i_idx], wk[:, k_idx].permute(1, 0, 2))
    out = torch.zeros(out_indices.shape[0], weight.shape[0], dtype=x.features.dtype)
    return out.index_add(0, rows, contrib)


def sort_rows(indices: torch.Tensor, *tensors: torch.Tensor):
    """Rows sorted by coordinates, for comparing outputs whose row order is not promised."""
    key = indices.long()
    order = torch.from_numpy(np.lexsort(key.numpy().T[::-1]).copy())
    return (indices[order],) + tuple(t[order] for t in tensors)


def low_precision_ok(diff: torch.Tensor, cin: int, cout: int) -> bool:
    """The FP16/BF16 criterion against an FP32 reference."""
    return float(diff.detach().float().norm()) < 10 * max(1.0, max(cin, cout) / 16)
