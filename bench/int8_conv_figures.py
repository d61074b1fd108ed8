"""The CPU int8 convolution's figures on one voxelized scan: SubM 3x3x3 C->C with the kernel map cached, the
int8 op (quantized_conv over the map's neighbour table) against the FP32 native route (indice_conv over the
same map's pairs), and both against torch.mm's FP32 peak (2048^3). The three run alternately, best of --reps
each (on a shared machine the best is the least disturbed run).

    python bench/int8_conv_figures.py --data lidar-voxels-125k.npz [--channels 16 32 64 128] [--reps 10]

SPCONV_FUSED_CPU_GEMM=0 times the FP32 route with the vendor GEMM instead of the fused AVX-512 kernel.
"""
import argparse
import time

import numpy as np
import torch

import spconv  # noqa: F401  (loads the op library)


def best_ms(fns, reps):
    """Best time of each function in ms, running them in turn (warm-up first)."""
    best = [float("inf")] * len(fns)
    for it in range(reps + 1):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            fn()
            if it > 0:
                best[k] = min(best[k], time.perf_counter() - t0)
    return [b * 1e3 for b in best]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", required=True, help=".npz with indices [N, 4] and spatial_shape")
    parser.add_argument("--channels", type=int, nargs="+", default=[16, 32, 64, 128])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    d = np.load(args.data)
    idx = torch.from_numpy(d["indices"]).int()
    shape = [int(v) for v in d["spatial_shape"]]
    n = idx.shape[0]
    _, pin, pout, poff, info, table = torch.ops.spconv.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3,
                                                                         [1] * 3, [1] * 3, True, False)
    pairs = pin.numel()
    a, b = torch.randn(2048, 2048), torch.randn(2048, 2048)
    print(f"{n} voxels, {pairs} pairs ({pairs / n:.1f} per row), threads {torch.get_num_threads()}, "
          f"int8 path {torch.ops.spconv.quantized_conv_path(torch.zeros(1, 1, dtype=torch.int8))}, best of {args.reps}")
    g = torch.Generator().manual_seed(0)
    for c in args.channels:
        x8 = torch.randint(-128, 128, (n, c), dtype=torch.int8, generator=g)
        w8 = torch.randint(-128, 128, (27, c, c), dtype=torch.int8, generator=g)
        scale = torch.full((c,), 1.0 / (c * 27 * 64 * 8))
        bias = torch.randn(c, generator=g)
        xf, wf = x8.float(), w8.float()
        with torch.no_grad():
            t8, tf, tm = best_ms([
                lambda: torch.ops.spconv.quantized_conv(x8, w8, table, scale, bias, None, 0.0, 1, 0.0, info),
                lambda: torch.ops.spconv.indice_conv(xf, wf, pin, pout, poff, n, info),
                lambda: torch.mm(a, b)], args.reps)
        peak = 2 * 2048 ** 3 / tm / 1e6  # GFLOP/s
        ops = 2 * pairs * c * c / 1e9
        print(f"SubM 3x3x3 {c:3d}->{c:<3d} int8 {t8:7.1f} ms ({ops / t8 * 1e3:5.0f} GOP/s, {ops / t8 * 1e3 / peak:.2f}x "
              f"the mm peak)   FP32 {tf:7.1f} ms ({ops / tf * 1e3:5.0f} GFLOP/s)   int8 speed-up {tf / t8:.2f}x   "
              f"torch.mm 2048^3 {peak:.0f} GFLOP/s")


if __name__ == "__main__":
    main()
