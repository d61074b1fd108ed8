"""The C++ deployment example end to end: a network goes through torch.export and AOTInductor
(examples/cpp_deploy/make_package.py), the C++ program builds with CMake against the installed torch and this
op library (find_package(Spconv)), and its output checksums equal eager PyTorch's, bit for bit. Runs on a crop
of the real scan when present (SPCONV_REAL_SCAN or ../shared/data), on the synthetic scan otherwise."""
import json
import os
import shutil
import subprocess
import sys

import pytest
import torch

from spconv import deploy

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLE = os.path.join(ROOT, "examples", "cpp_deploy")
BUILD = os.path.join(ROOT, "build", "cpp_deploy")  # kept between runs: later builds are incremental
REAL_SCAN = os.environ.get("SPCONV_REAL_SCAN", os.path.join(ROOT, "..", "shared", "data", "lidar-voxels-125k.npz"))
CROP = ["80", "96", "96"]  # a few thousand voxels: the C++ run takes seconds

sys.path.insert(0, EXAMPLE)
import make_package  # noqa: E402


def _required() -> bool:
    return bool(os.environ.get("CI"))


@pytest.fixture(scope="module")
def run_package():
    """The example program, configured and built with cmake into build/cpp_deploy."""
    cmake = shutil.which("cmake")
    if cmake is None:
        if _required():
            pytest.fail("cmake is needed to build the C++ deployment example in CI")
        pytest.skip("cmake not found")
    prefix = ";".join([torch.utils.cmake_prefix_path, deploy.cmake_prefix_path])
    subprocess.run([cmake, "-S", EXAMPLE, "-B", BUILD, "-DCMAKE_BUILD_TYPE=Release", "-DCMAKE_PREFIX_PATH=" + prefix],
                   check=True, capture_output=True, text=True)
    subprocess.run([cmake, "--build", BUILD, "-j", str(min(4, os.cpu_count() or 1))], check=True,
                   capture_output=True, text=True)
    return os.path.join(BUILD, "run_package")


def _scene_args():
    if os.path.exists(REAL_SCAN):
        return ["--scan", REAL_SCAN, "--crop", *CROP]
    return ["--crop", *CROP]


@pytest.mark.slow
@pytest.mark.parametrize("model", ["backbone8x", "basic"])
def test_cpp_run_equals_eager(model, run_package, tmp_path):
    make_package.main(["--model", model, "--out", str(tmp_path), "--repeat", "1"] + _scene_args())
    expected = (tmp_path / "expected.txt").read_text().strip()  # eager checksums (make_package checked AOTI)
    channels = str(json.loads((tmp_path / "run.json").read_text())["channels"])
    run = subprocess.run([run_package, str(tmp_path / "model.pt2"), str(tmp_path / "features.f32"),
                          str(tmp_path / "indices.i32"), channels], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.strip() == expected, (run.stdout, expected)
