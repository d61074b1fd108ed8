"""Pooling geometries checked against dense torch pooling, their test ids, and the dense window sum of avg pools."""
import itertools

import torch
import torch.nn.functional as F

_CONV = {1: F.conv1d, 2: F.conv2d, 3: F.conv3d}

# The dense grid of each dimension.
DENSE_SHAPES = {1: [13], 2: [9, 8], 3: [7, 6, 5]}


def dense_pool_cases():
    """(nd, kernel, stride, padding, dilation) that dense torch pooling accepts on DENSE_SHAPES."""
    out = []
    for nd, k, s, p, d in itertools.product((1, 2, 3), (2, 3), (1, 2, 3), (0, 1), (1, 2)):
        # torch's pooling needs padding <= kernel_size / 2 (so no window lies wholly in the padding).
        if 2 * p > k:
            continue
        if any((n + 2 * p - d * (k - 1) - 1) // s + 1 <= 0 for n in DENSE_SHAPES[nd]):
            continue
        out.append((nd, k, s, p, d))
    return out


DENSE_CASES = dense_pool_cases()


def case_id(c):
    return "nd{}_k{}_s{}_p{}_d{}".format(*c)


def dense_window_sum(t, k, s, p, d):
    """Sum over every window (zero padding), channel by channel, as a grouped conv with a ones kernel."""
    nd = t.dim() - 2
    c = t.shape[1]
    ones = torch.ones((c, 1) + (k,) * nd, dtype=t.dtype)
    return _CONV[nd](t, ones, stride=s, padding=p, dilation=d, groups=c)
