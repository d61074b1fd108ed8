"""tools/gpu_build.py: the nvcc arch flags always embed PTX (by default for the highest arch), so a GPU the
build doesn't list (sm_100 / sm_120, or sm_90 under an 8.0-only build) JIT-compiles it instead of failing."""
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


@pytest.mark.hip_cpu
def test_hip_cpu_build_reports_simt(hip_cpu):
    import torch
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        assert hip_cpu.fused_conv_path(torch.zeros(1, 1, dtype=dt)) == "simt"
