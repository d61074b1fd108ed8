"""tools/gpu_build.py: the nvcc arch flags always embed PTX (by default for the highest arch), so a GPU the
build doesn't list (sm_100 / sm_120, or sm_90 under an 8.0-only build) JIT-compiles it instead of failing; the
CUDA runtime library is found through nvcc also when nvcc is a wrapper script outside the toolkit."""
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools"))
import gpu_build  # noqa: E402


def ptx_of(flags):
    return [f.split("code=compute_")[1] for f in flags if "code=compute_" in f]


def sass_of(flags):
    return [f.split("code=sm_")[1] for f in flags if "code=sm_" in f]


@pytest.mark.parametrize("archs, ptx", [
    ([("80", False), ("90", False)], ["90"]),       # before: no PTX at all
    ([("80", False)], ["80"]),                      # an 8.0-only build still runs on sm_90 / sm_100
    ([("90", False), ("100", False), ("80", False)], ["100"]),  # numeric, not string, order
    ([("80", False), ("90a", False)], ["80"]),      # arch-specific targets carry no PTX forward
    ([("80", True), ("90", False)], ["80"]),        # an explicit +PTX is kept as it is
])
def test_ptx_for_the_highest_arch_by_default(archs, ptx):
    flags = gpu_build.cuda_arch_flags(archs)
    assert ptx_of(flags) == ptx
    assert sass_of(flags) == [a for a, _ in archs]


def test_cudart_found_through_an_nvcc_wrapper(tmp_path):
    # /usr/local/bin/nvcc as `exec <toolkit>/bin/nvcc "$@"`: torch guesses CUDA_HOME=/usr/local, which has no
    # libcudart (the first GPU build on a real machine failed to link so). nvcc's dry run names the toolkit.
    toolkit = tmp_path / "cuda-13.0"
    (toolkit / "bin").mkdir(parents=True)
    (toolkit / "targets" / "x86_64-linux" / "lib").mkdir(parents=True)
    (toolkit / "targets" / "x86_64-linux" / "lib" / "libcudart.so").write_text("")
    real = toolkit / "bin" / "nvcc"
    real.write_text('#!/bin/sh\necho "#$ _HERE_=%s/bin"\necho "#$ TOP=%s/bin/.."\n' % (toolkit, toolkit))
    wrapper_home = tmp_path / "local"
    (wrapper_home / "bin").mkdir(parents=True)
    wrapper = wrapper_home / "bin" / "nvcc"
    wrapper.write_text('#!/bin/sh\nexec %s "$@"\n' % real)
    for f in (real, wrapper):
        f.chmod(0o755)
    assert gpu_build._cudart_dir(str(wrapper_home), str(wrapper)) == str(toolkit / "targets" / "x86_64-linux" / "lib")
    with pytest.raises(RuntimeError, match="libcudart.so not found"):
        gpu_build._cudart_dir(str(wrapper_home), str(tmp_path / "missing-nvcc"))


@pytest.mark.hip_cpu
def test_hip_cpu_build_reports_simt(hip_cpu):
    import torch
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        assert hip_cpu.fused_conv_path(torch.zeros(1, 1, dtype=dt)) == "simt"


@pytest.mark.parametrize("cxx, host, hipcc", [
    ("hipcc", "g++", "hipcc"),                    # DTK's spelling: CXX=hipcc python3 setup.py build_ext --inplace
    ("/opt/dtk/bin/hipcc", "g++", "/opt/dtk/bin/hipcc"),
    ("g++", "g++", None),                         # any other compiler is left alone
    ("clang++ -stdlib=libstdc++", "clang++ -stdlib=libstdc++", None),
    ("", "", None),
])
def test_cxx_hipcc_compiles_the_gpu_kernels_and_the_host_compiler_the_rest(cxx, host, hipcc, monkeypatch):
    monkeypatch.setattr(gpu_build.shutil, "which", lambda name: name if name in ("g++", "hipcc") else None)
    env = {"CXX": cxx} if cxx else {}
    assert gpu_build.take_hipcc_from_cxx(env) == hipcc
    assert env.get("CXX", "") == host
    env = {"CXX": "hipcc", "SPCONV_HOST_CXX": "g++-12"}
    assert gpu_build.take_hipcc_from_cxx(env) == "hipcc" and env["CXX"] == "g++-12"


def test_hip_build_uses_the_hipcc_of_cxx(monkeypatch):
    monkeypatch.setenv("ROCM_PATH", "/nonexistent-rocm")
    assert gpu_build.configure("hip", "/src", hipcc="/opt/dtk-24/bin/hipcc").compiler == "/opt/dtk-24/bin/hipcc"
    assert gpu_build.configure("hip", "/src").compiler == "hipcc"  # ROCM_PATH has none: the one on PATH
