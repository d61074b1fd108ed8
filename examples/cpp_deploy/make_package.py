"""Python half of the C++ deployment example: builds a network, runs it eagerly, exports it with a dynamic
voxel count, AOT-compiles it into a package, checks the package in Python, and writes the C++ program's
inputs (raw features.f32 / indices.i32) and the expected checksum lines (expected.txt).

    python3 examples/cpp_deploy/make_package.py --model backbone8x --scan scan.npz --out build/deploy
    build/deploy/cpp/run_package build/deploy/model.pt2 build/deploy/features.f32 build/deploy/indices.i32 3

Without --scan it uses the seeded synthetic scan; --crop Z Y X takes the densest window of that size.
The input sizes and timings (seconds) go to run.json in --out.
"""
import argparse
import json
import os
import time

import numpy as np
import torch

from spconv import deploy
from spconv.benchmark import scenes
from spconv.benchmark.deploy_models import MODELS, build


def load_input(scan, crop):
    if scan:
        feats, idx, shape = scenes.load_voxels_npz(scan)
    else:
        feats, idx, shape = scenes.synthetic_scan(quick=True)
    if crop:
        feats, idx, shape = scenes.crop(feats, idx, scenes.crop_window(idx, crop), crop)
    return torch.from_numpy(np.ascontiguousarray(feats)), torch.from_numpy(np.ascontiguousarray(idx)), shape


def timed(fn, repeat):
    """(last result, best wall time of ``repeat`` runs after one warm-up)."""
    out = fn()
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t)
    return out, best


def as_tuple(out):
    return tuple(out) if isinstance(out, (tuple, list)) else (out,)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--scan", help="voxelized scan .npz (features, indices, spatial_shape); default: synthetic")
    p.add_argument("--crop", type=int, nargs=3, metavar=("Z", "Y", "X"), help="use the densest window of this size")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--repeat", type=int, default=3, help="timed runs of eager and the package (best is kept)")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)

    features, indices, shape = load_input(args.scan, args.crop)
    model = build(args.model, features.shape[1], shape)
    timings = {"num_voxels": int(features.shape[0]), "channels": int(features.shape[1]), "spatial_shape": shape}
    with torch.inference_mode():
        ref, timings["eager_s"] = timed(lambda: as_tuple(model(features, indices)), args.repeat)

    t = time.perf_counter()
    ep = deploy.export(model, features, indices)
    timings["export_s"] = time.perf_counter() - t
    with torch.inference_mode():
        exported = as_tuple(ep.module()(features, indices))
    if not all(torch.equal(a, b) for a, b in zip(exported, ref)):
        raise SystemExit("ep.module() differs from eager")

    package = os.path.join(args.out, "model.pt2")
    t = time.perf_counter()
    deploy.aoti_compile_and_package(ep, package)
    timings["aoti_compile_s"] = time.perf_counter() - t
    runner = torch._inductor.aoti_load_package(package)
    with torch.inference_mode():
        compiled, timings["aoti_python_s"] = timed(lambda: as_tuple(runner(features, indices)), args.repeat)
    timings["aoti_equals_eager"] = all(torch.equal(a, b) for a, b in zip(compiled, ref))

    features.numpy().tofile(os.path.join(args.out, "features.f32"))
    indices.numpy().tofile(os.path.join(args.out, "indices.i32"))
    expected = deploy.checksum_lines(ref)
    with open(os.path.join(args.out, "expected.txt"), "w") as f:
        f.write(expected + "\n")
    with open(os.path.join(args.out, "run.json"), "w") as f:
        json.dump(timings, f, indent=2)
    print(expected)
    print(json.dumps(timings))
    if not timings["aoti_equals_eager"]:
        raise SystemExit("the AOTInductor package differs from eager")


if __name__ == "__main__":
    main()
