"""Launches and host waits of a layer that builds its kernel map, counted on the GPU code run on the CPU (the
HIP CPU build): each layer runs once building its map and once with the map cached (same indice_key), and the
build's share is the difference. Counted per forward:
  project ops     the op library's operators called (torch.ops.<namespace>.*)
  kernels         project kernel launches (the HIP CPU build's launch ledger, debug_launch_ledger)
  ATen launches   ATen ops called anywhere (Python or the glue) that do device work: an op whose profiler
                  subtree holds an op other than allocation, views and metadata (zeros = 1, to(dtype) = 1)
  host waits      the glue's device->host copies (host_copy_count) plus ATen ops that wait for a GPU
                  (item, nonzero, ...)

Usage: python3 tools/map_build_counts.py [--variant simt] [--n 2000]
"""
import argparse
import os
import sys

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "test"))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variant", default="simt")
    ap.add_argument("--n", type=int, default=2000)
    ap.add_argument("--verbose", action="store_true")
    a = ap.parse_args()
    from support.launch_counts import count
    from conftest import hip_cpu_library
    import spconv.pytorch as spconv
    from spconv import _backend
    from support.sites import coords

    lib = hip_cpu_library(a.variant)
    shape = [40, 40, 40]
    idx = coords(shape, 2, a.n, seed=1)
    x = spconv.SparseConvTensor(torch.randn(idx.shape[0], 16), idx, shape, 2)
    torch.manual_seed(0)
    layers = {
        "SubMConv3d(16, 16, 3)": lambda key: spconv.SubMConv3d(16, 16, 3, indice_key=key),
        "SparseConv3d(16, 16, 3, 2, 1)": lambda key: spconv.SparseConv3d(16, 16, 3, 2, 1, indice_key=key),
        "SparseMaxPool3d(2, 2)": lambda key: spconv.SparseMaxPool3d(2, 2, indice_key=key),
    }
    print("%-30s %-6s %8s %8s %8s %6s" % ("layer (forward)", "map", "proj.ops", "kernels", "ATen", "waits"))
    with _backend.gpu_code_on_cpu(lib.name), torch.no_grad():
        for name, make in layers.items():
            layer = make("k")
            built = {}
            built_counts = count(lib, lambda: built.setdefault("y", layer(x)))
            # The same layer again on a tensor that already holds its map under the key.
            again = spconv.SparseConvTensor(x.features, x.indices, x.spatial_shape, x.batch_size,
                                            indice_dict=dict(built["y"].indice_dict))
            cached = None
            if "SubM" in name:
                cached = count(lib, lambda: layer(again))
            for label, c in (("built", built_counts), ("cached", cached)):
                if c is None:
                    continue
                print("%-30s %-6s %8d %8s %8d %6d" % (name, label, c["project"],
                                                        "-" if c["kernels"] is None else c["kernels"], c["aten"],
                                                        c["waits"]))
                if a.verbose:
                    print("    ", c["ops"])


if __name__ == "__main__":
    main()
