"""Bounded probing of the kernel-map hash table (csrc/hip/kernel_map.cu), run on the HIP CPU runtime, and the
wavefront size the HIP device pass must be told (hip_compat.h)."""
import os
import shutil
import subprocess
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.slow
@pytest.mark.hip_cpu
def test_full_hash_table_is_reported(tmp_path, hip_cpu):
    """Before: hash_insert probed forever once the table was full (the program timed out)."""
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import hip_cpu_build
    src_root = os.environ.get("SPCONV_HIP_CPU_SOURCE_ROOT") or ROOT  # as the hip_cpu fixture builds
    exe = str(tmp_path / "hash_bounds")
    tbb_compile, tbb_link = hip_cpu_build.tbb_flags()  # oneTBB where the HIP CPU build finds it (pip's or the system's)
    cmd = [os.environ.get("CXX", "g++"), "-std=c++17", "-O1", "-x", "c++", "-DSPCONV_HIP_CPU=1", "-pthread",
           "-isystem", os.path.join(hip_cpu_build.runtime_root(), "include")] + tbb_compile + [
           "-I" + os.path.join(src_root, "csrc"), "-I" + os.path.join(src_root, "csrc", "include"),
           os.path.join(ROOT, "test", "cpp", "hash_bounds.cpp"), "-o", exe] + tbb_link + ["-lpthread"]
    subprocess.run(cmd, check=True, capture_output=True)
    r = subprocess.run([exe], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def _hipcc():
    hipcc = shutil.which("hipcc")
    if hipcc is None:
        pytest.skip("hipcc not installed")
    return hipcc


def _device_pass(tmp_path, extra):
    src = tmp_path / "w.hip"
    src.write_text('#include "hip/hip_compat.h"\n'
                   '__global__ void k(int* o) { o[0] = SPCONV_WARP_SIZE; }\n')
    env = dict(os.environ, HIP_PLATFORM="amd")
    return subprocess.run([_hipcc(), "-x", "hip", "--cuda-device-only", "-fsyntax-only", "-I" + os.path.join(ROOT, "csrc"),
                           "-I" + os.path.join(ROOT, "csrc", "include"), str(src)] + extra,
                          capture_output=True, text=True, env=env)


@pytest.mark.parametrize("arch", ["gfx906", "gfx1030"])
def test_device_pass_without_wavefront_macro_fails(tmp_path, arch):
    """Before: the device pass silently took 64, wrong on wave32 targets (gfx10+)."""
    r = _device_pass(tmp_path, ["--offload-arch=" + arch, "-U__AMDGCN_WAVEFRONT_SIZE",
                                "-U__AMDGCN_WAVEFRONT_SIZE__"])
    assert r.returncode != 0 and "wavefront size" in r.stderr


def test_device_pass_with_wavefront_macro_compiles(tmp_path):
    r = _device_pass(tmp_path, ["--offload-arch=gfx1030"])
    assert r.returncode == 0, r.stderr
