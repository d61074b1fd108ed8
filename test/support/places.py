"""Where the GPU code runs in a test: on a GPU (``cuda``: torch.ops.spconv on CUDA/ROCm tensors) or on the CPU
through the HIP CPU build (``hip_cpu``: the same glue and kernels in their own op namespace, on CPU tensors). One
test body takes the ``gpu_place`` fixture (conftest.py) and runs on both; the GPU's is skipped without a GPU."""
import contextlib

import pytest
import torch

from spconv import _backend

GPU_PLACES = [
    pytest.param("hip_cpu", marks=pytest.mark.hip_cpu),
    pytest.param("cuda", marks=pytest.mark.gpu),  # skipped without a GPU (conftest); hip_cpu runs the same code
]


class Place:
    """``ops``: the op library whose GPU code runs here; ``device``: where its tensors live; ``active()``: the
    context in which the Python layers take this route (needed for hip_cpu, whose tensors are CPU tensors)."""

    def __init__(self, name: str, hip_cpu_ops=None):
        self.name = name
        self.ops = hip_cpu_ops if name == "hip_cpu" else torch.ops.spconv
        self.device = torch.device("cpu" if name == "hip_cpu" else "cuda")

    @contextlib.contextmanager
    def active(self):
        if self.name == "hip_cpu":
            with _backend.gpu_code_on_cpu(self.ops.name):
                yield
        else:
            yield

    def to(self, t: torch.Tensor) -> torch.Tensor:
        return t.to(self.device)

    def synchronize(self):
        if self.device.type == "cuda":
            torch.cuda.synchronize()
