"""The native route's headline CPU figures on one voxelized scan: SubM 3x3x3 kernel-map time, and a cached-map
SubMConv3d 64->64 forward and forward+backward against torch.mm on the same useful FLOPs.

    python bench/native_route_figures.py --data lidar-voxels-125k.npz [--reps 12]
"""
import argparse
import time

import numpy as np
import torch

from spconv.pytorch import ops


def median_ms(samples):
    return float(np.median(samples)) * 1e3


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help=".npz with indices [N, 4] and spatial_shape")
    parser.add_argument("--channels", type=int, default=64)
    parser.add_argument("--reps", type=int, default=12)
    args = parser.parse_args()
    d = np.load(args.data)
    idx = torch.from_numpy(d["indices"]).int()
    shape = [int(v) for v in d["spatial_shape"]]
    n, c = idx.shape[0], args.channels

    def build():
        return ops.build_kernel_map(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)

    _, maps = build()
    pairs = maps.pair_in.numel()
    x = torch.randn(n, c, requires_grad=True)
    w = (torch.randn(27, c, c) * 0.1).requires_grad_(True)
    a, b = torch.randn(pairs, c), torch.randn(c, c)
    t_map, t_fwd, t_fb, t_mm = [], [], [], []
    for it in range(args.reps + 2):  # kernel-map building on its own, as a layer without a cached map does
        t0 = time.perf_counter()
        build()
        if it >= 2:
            t_map.append(time.perf_counter() - t0)
    for it in range(args.reps + 2):  # the first two are warm-ups
        t1 = time.perf_counter()
        with torch.no_grad():
            ops.indice_conv_native(x, w, maps, n)
        t2 = time.perf_counter()
        y = ops.indice_conv_native(x, w, maps, n)
        y.backward(torch.ones_like(y))
        x.grad = w.grad = None
        t3 = time.perf_counter()
        torch.mm(a, b)
        t4 = time.perf_counter()
        if it >= 2:
            t_fwd.append(t2 - t1), t_fb.append(t3 - t2), t_mm.append(t4 - t3)
    fwd, fb, mm = median_ms(t_fwd), median_ms(t_fb), median_ms(t_mm)
    print(f"{n} voxels, {pairs} pairs, threads {torch.get_num_threads()}, median of {args.reps}")
    print(f"SubM 3x3x3 kernel map:            {median_ms(t_map):8.1f} ms")
    print(f"SubMConv3d {c}->{c} forward (cached):  {fwd:8.1f} ms   torch.mm [{pairs}x{c}]@[{c}x{c}] {mm:.1f} ms"
          f"   forward / mm = {fwd / mm:.2f}")
    print(f"forward+backward:                 {fb:8.1f} ms   = {fb / fwd:.2f}x forward")


if __name__ == "__main__":
    main()
