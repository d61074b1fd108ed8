"""A small GPU workload for compute-sanitizer (memcheck / racecheck), run by tools/device_check.sh.

    python tools/device_sanitize_case.py normal|duplicates

Every GPU route once, forward and backward, FP32 and FP16: the kernel maps (SubM, regular, inverse), the fused
and native convolutions, max/avg pooling. `duplicates` repeats input coordinates (accepted by regular convs and
pools: one site holding the summed features), the case whose writes could race. Small on purpose: racecheck
runs kernels hundreds of times slower.
"""
import sys

import torch

import spconv.pytorch as spconv
from spconv import constants


def scene(duplicates, n=600, grid=24, seed=0):
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, grid, (n, 3), generator=g, dtype=torch.int32), dim=0)
    if duplicates:
        coords = torch.cat([coords, coords[: len(coords) // 4]])
    batch = torch.zeros(len(coords), 1, dtype=torch.int32)
    return torch.cat([batch, coords], 1), [grid] * 3


def run(duplicates, dtype, dev):
    indices, shape = scene(duplicates)
    x = torch.randn(len(indices), 40, device=dev, dtype=dtype, requires_grad=True)
    t = spconv.SparseConvTensor(x, indices.to(dev), shape, 1)
    down = spconv.SparseConv3d(40, 72, 3, stride=2, padding=1, indice_key="d1").to(dev, dtype)
    up = spconv.SparseInverseConv3d(72, 40, 3, indice_key="d1").to(dev, dtype)
    y = up(down(t))
    if not duplicates:  # SubM needs unique coordinates
        y = spconv.SubMConv3d(40, 40, 3, indice_key="s1").to(dev, dtype)(y)
    p = spconv.SparseMaxPool3d(2, 2)(y)
    a = spconv.SparseAvgPool3d(2, 2)(y)
    (p.features.float().sum() + a.features.float().sum()).backward()
    torch.cuda.synchronize()
    return float(x.grad.float().abs().sum())


def main():
    case = sys.argv[1] if len(sys.argv) > 1 else "normal"
    if case not in ("normal", "duplicates"):
        raise SystemExit("usage: device_sanitize_case.py normal|duplicates")
    dev = torch.device("cuda")
    for native in (False, True):
        constants.SPCONV_FORCE_NATIVE = native  # read per call by the route policy
        for dtype in (torch.float32, torch.float16):
            g = run(case == "duplicates", dtype, dev)
            print(f"{case} {'native' if native else 'fused'} {dtype}: |dx| = {g:.4g}")


if __name__ == "__main__":
    main()
