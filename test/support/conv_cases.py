"""Convolution geometries and helpers shared by the tests of the convolution ops (test_fused_cpu.py,
test_gpu_code_ops.py, test_hip_cpu_variants.py, test_gpu_code_fused_backward.py): the small maps every GPU thread
of the HIP CPU build can run as a fiber, the fused CPU tests' maps, random operands of one layer, the native
route's FP64 reference and plain-torch backward, order-independent pair sets, and the relative error with the
tolerance of each dtype."""
import torch

import spconv._backend  # noqa: F401  (torch.ops.spconv)
from support.sites import random_coords

cpu = torch.ops.spconv


def map_geometry(shape, batch, n, ksize, stride=1, padding=0, dilation=1, subm=True, transpose=False, seed=0):
    """Random indices and the get_indice_pairs arguments after them, for one conv geometry."""
    nd = len(shape)
    ks, st, pd, dl = ([v] * nd if isinstance(v, int) else list(v) for v in (ksize, stride, padding, dilation))
    if subm:
        out_shape = list(shape)
    elif transpose:
        out_shape = [(s - 1) * t - 2 * p + d * (k - 1) + 1 for s, k, t, p, d in zip(shape, ks, st, pd, dl)]
    else:
        out_shape = [(s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(shape, ks, st, pd, dl)]
    idx = random_coords(shape, batch, n, seed)
    return idx, (batch, list(shape), out_shape, ks, st, pd, dl, subm, transpose)


class Maps:
    """A kernel map's pairs and row counts, with the ``cache`` the layers' maps carry (the fused route's tables)."""

    def __init__(self, pair_in, pair_out, pair_offsets, num_in, num_out):
        self.pair_in, self.pair_out, self.pair_offsets = pair_in, pair_out, pair_offsets
        self.num_in, self.num_out = num_in, num_out
        self.cache = {}


# name -> geometry; chosen to reach kernel volumes 1, 8, 27, 125, 2-D and 4-D, strides, dilation, transpose
MAPS = {
    "subm_k1": dict(shape=[6, 6, 6], batch=1, n=50, ksize=1),
    "subm3": dict(shape=[6, 7, 5], batch=2, n=120, ksize=3),
    "subm_dense": dict(shape=[4, 4, 4], batch=1, n=64, ksize=3),
    "subm5_kvol125": dict(shape=[7, 7, 7], batch=1, n=90, ksize=5),
    "subm2d_k12": dict(shape=[9, 9], batch=2, n=70, ksize=(1, 2)),
    "dilated": dict(shape=[10, 10, 10], batch=1, n=100, ksize=3, dilation=2),
    "conv_s2": dict(shape=[9, 8, 7], batch=2, n=150, ksize=3, stride=2, padding=1, subm=False),
    "conv_k2s2": dict(shape=[8, 8, 8], batch=1, n=100, ksize=2, stride=2, subm=False),
    "conv4d": dict(shape=[4, 4, 4, 3], batch=1, n=60, ksize=2, stride=1, subm=False),
    "deconv": dict(shape=[5, 4, 6], batch=1, n=40, ksize=3, stride=2, padding=1, subm=False, transpose=True),
}

# The fused route's CPU tests' geometries (test_fused_cpu.py; a GPU runs them too), name -> geometry.
FUSED_CPU_CASES = {
    "subm3": dict(shape=[6, 7, 5], batch=2, n=120, ksize=3),
    "subm_dense": dict(shape=[4, 4, 4], batch=1, n=64, ksize=3),  # every site active
    "subm_sparse": dict(shape=[30, 30, 30], batch=1, n=40, ksize=3),  # few neighbours
    "subm5_kvol125": dict(shape=[8, 8, 8], batch=1, n=200, ksize=5),  # > 32 offsets: grouped mask bits
    "subm_k12": dict(shape=[9, 9], batch=2, n=70, ksize=(1, 2)),  # kvol 2
    "conv_s2": dict(shape=[9, 8, 7], batch=2, n=150, ksize=3, stride=2, padding=1, subm=False),
    "conv_k2s2": dict(shape=[8, 8, 8], batch=1, n=100, ksize=2, stride=2, subm=False),
    "deconv": dict(shape=[5, 4, 6], batch=1, n=40, ksize=3, stride=2, padding=1, subm=False, transpose=True),
    "dilated": dict(shape=[10, 10, 10], batch=1, n=150, ksize=3, dilation=2),
}

# Relative to the norm: FP32 against the CPU route on the same inputs, FP16/BF16 against an FP64 reference.
TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}


def as_maps(res, num_in):
    """Maps of a get_indice_pairs result."""
    out_idx, pin, pout, poff = res[:4]
    return Maps(pin, pout, poff, num_in, out_idx.shape[0])


def rel_err(got, ref):
    ref = ref.double()
    return (torch.linalg.norm(got.double() - ref) / max(torch.linalg.norm(ref).item(), 1e-30)).item()


def fused_inputs(m, cin, cout, dtype, seed=7):
    """(features, filters, output gradient) on the CPU for the map m."""
    g = torch.Generator().manual_seed(seed)
    kvol = m.pair_offsets.numel() - 1
    x = torch.randn(m.num_in, cin, generator=g).to(dtype)
    w = (torch.randn(kvol, cin, cout, generator=g) / (cin * 3) ** 0.5).to(dtype)
    dy = torch.randn(m.num_out, cout, generator=g).to(dtype)
    return x, w, dy


def native_f64(x, w, dy, m):
    """(forward, dinput, dfilter) of the CPU route in FP64 on the same (rounded) CPU inputs."""
    x, w, dy = x.double(), w.double(), dy.double()
    y = cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out)
    dx, dw = cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets)
    return y, dx, dw


def native_backward(features, filters, dy, m):
    """(dinput, dfilter) of the map m in plain torch (independent of the extension's native route)."""
    dx = torch.zeros_like(features)
    dw = torch.zeros_like(filters)
    for k in range(filters.shape[0]):
        a, b = int(m.pair_offsets[k]), int(m.pair_offsets[k + 1])
        pin, pout = m.pair_in[a:b].long(), m.pair_out[a:b].long()
        dx.index_add_(0, pin, dy[pout] @ filters[k].t())
        dw[k] = features[pin].t() @ dy[pout]
    return dx, dw


def sorted_pairs(pin, pout, poff):
    """Pair sets per offset as sorted (out, in) keys: order-independent comparison."""
    res = []
    for k in range(poff.numel() - 1):
        a, b = int(poff[k]), int(poff[k + 1])
        key = pout[a:b].long() * (1 << 32) + pin[a:b].long()
        res.append(torch.sort(key).values)
    return res
