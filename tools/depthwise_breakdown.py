"""Where a depthwise SubM layer's time goes on the CPU: the same grouped_conv op over three neighbour tables with
the real table's valid entries (the same pairs per row, so the same arithmetic and output traffic):

  real        the scan's own table;
  in-cache    every entry taken mod 1024 (all gathered rows stay in L2: arithmetic, compaction, output);
  sequential  every row gathers itself (the input read in order, once per pair).

Also prints how far in rows the neighbour reads land (the input's order is the caller's: a SubM layer keeps it).
Rounds alternate the tables so that all see the same machine.

Usage: python tools/depthwise_breakdown.py --data scan.npz [--channels 128] [--threads 2] [--rounds 3]
"""
import argparse
import time

import numpy as np
import torch

import spconv.pytorch as sp
from spconv.pytorch import _grouped


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="voxelized scan: indices, spatial_shape")
    p.add_argument("--channels", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=9)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    d = np.load(a.data)
    idx = torch.from_numpy(np.ascontiguousarray(d["indices"], dtype=np.int32))
    shape = [int(v) for v in d["spatial_shape"]]
    c = a.channels
    x = sp.SparseConvTensor(torch.randn(idx.shape[0], c), idx, shape, 1)
    layer = sp.SubMConv3d(c, c, 3, groups=c, bias=False, indice_key="k")
    with torch.no_grad():
        nbr, _ = _grouped.tables(layer(x).indice_dict["k"].maps, False)
    filters = _grouped.weight_to_grouped_filters(layer.weight.detach(), c)
    rows = torch.arange(len(nbr), dtype=torch.int32).view(-1, 1).expand_as(nbr)
    tables = {"real": nbr, "in-cache": torch.where(nbr >= 0, nbr % 1024, nbr),
              "sequential": torch.where(nbr >= 0, rows, nbr).contiguous()}
    none = nbr[:0]
    times = {k: [] for k in tables}
    for _ in range(a.rounds):
        for k, t in tables.items():
            torch.ops.spconv.grouped_conv(x.features, filters, t, none)
            for _ in range(a.iters):
                t0 = time.perf_counter()
                torch.ops.spconv.grouped_conv(x.features, filters, t, none)
                times[k].append((time.perf_counter() - t0) * 1e3)
    for k, v in times.items():
        print(f"{k:<11} median {np.median(v):7.2f} ms  min {min(v):7.2f} ms")
    nb = nbr.numpy()
    dist = np.abs(nb - np.arange(len(nb))[:, None])[nb >= 0]
    print("neighbour distance in rows, percentiles 50/75/90/95/99:",
          " ".join(f"{np.percentile(dist, q):.0f}" for q in (50, 75, 90, 95, 99)))


if __name__ == "__main__":
    main()
