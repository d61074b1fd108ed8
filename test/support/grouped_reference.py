"""Dense references for grouped sparse layers: F.conv*(groups=g) / F.conv_transpose*(groups=g) on the
densified tensor (1-3D), and the per-group brute force of reference.py (any dimension, used for 4D)."""
from typing import List

import torch
import torch.nn.functional as F

import spconv.pytorch as spconv
from support.reference import brute_force, dense_weight, gather_sites

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}
_DECONV = {1: F.conv_transpose1d, 2: F.conv_transpose2d, 3: F.conv_transpose3d}


def deconv_weight(weight: torch.Tensor, groups: int) -> torch.Tensor:
    """[Cout, *k, Cin/g] -> F.conv_transposeNd's grouped layout [Cin, Cout/g, *k]."""
    w = dense_weight(weight)  # [Cout, Cin/g, *k]
    cout, cig = w.shape[:2]
    k = w.shape[2:]
    return w.reshape(groups, cout // groups, cig, *k).transpose(1, 2).reshape(groups * cig, cout // groups, *k)


def grouped_dense(kind: str, x: spconv.SparseConvTensor, weight: torch.Tensor, groups: int,
                  out_indices: torch.Tensor, out_shape: List[int], stride, padding, dilation) -> torch.Tensor:
    """Features at ``out_indices`` of the dense grouped equivalent (kind: subm, conv, deconv, inverse)."""
    nd = len(x.spatial_shape)
    xd = x.dense()
    ksize = list(weight.shape[1:-1])
    if kind == "subm":
        pad = [(k // 2) * d for k, d in zip(ksize, dilation)]
        y = _CONV[nd](xd, dense_weight(weight), None, 1, pad, dilation, groups)
    elif kind == "conv":
        y = _CONV[nd](xd, dense_weight(weight), None, stride, padding, dilation, groups)
    else:
        natural = [(i - 1) * s_ - 2 * p_ + d_ * (k - 1) + 1
                   for i, s_, p_, d_, k in zip(x.spatial_shape, stride, padding, dilation, ksize)]
        out_pad = [max(0, min(o - n_, max(s_, d_) - 1)) for o, n_, s_, d_ in zip(out_shape, natural, stride, dilation)]
        y = _DECONV[nd](xd, deconv_weight(weight, groups), None, stride, padding, out_pad, groups, dilation)
    full = torch.zeros(y.shape[:2] + tuple(out_shape), dtype=y.dtype)
    region = tuple(slice(0, min(a, b)) for a, b in zip(y.shape[2:], out_shape))
    full[(slice(None), slice(None)) + region] = y[(slice(None), slice(None)) + region]
    return gather_sites(full, out_indices)


def grouped_brute_force(kind: str, x: spconv.SparseConvTensor, weight: torch.Tensor, groups: int,
                        out_indices: torch.Tensor, out_shape: List[int], stride, padding, dilation) -> torch.Tensor:
    """Any dimension: each group is a dense conv of its channel slices (brute force per group)."""
    cig, cog = weight.shape[-1], weight.shape[0] // groups
    outs = []
    for g in range(groups):
        xg = spconv.SparseConvTensor(x.features[:, g * cig:(g + 1) * cig], x.indices, x.spatial_shape, x.batch_size)
        outs.append(brute_force(kind, xg, weight[g * cog:(g + 1) * cog], out_indices, out_shape, stride, padding,
                                dilation))
    return torch.cat(outs, 1)


def grouped_reference(kind, x, weight, groups, out_indices, out_shape, stride, padding, dilation):
    fn = grouped_dense if len(x.spatial_shape) <= 3 else grouped_brute_force
    return fn(kind, x, weight, groups, out_indices, out_shape, stride, padding, dilation)
