"""Where the GPU code runs in a test: on a GPU (``cuda``: torch.ops.spconv on CUDA/ROCm tensors) or on the CPU
through the HIP CPU build (``hip_cpu``: the same glue and kernels in their own op namespace, on CPU tensors). One
test body takes the ``gpu_place`` fixture (conftest.py) and runs on both; the GPU's is skipped without a GPU.
Where the places need their own cases (sizes: every GPU thread is a fiber on hip_cpu) or the HIP CPU build runs
in both thread orders of a block, a test parametrizes gpu_place itself: ``per_place`` and ``on_places``."""
import contextlib

import pytest
import torch

from spconv import _backend

GPU_PLACES = [
    pytest.param("hip_cpu", marks=pytest.mark.hip_cpu),
    pytest.param("cuda", marks=pytest.mark.gpu),  # skipped without a GPU (conftest); hip_cpu runs the same code
]
# The HIP CPU build with each block's threads in ascending and in descending order (conftest.thread_order): a
# barrier missing between two threads of a block changes some result in one of them. A GPU runs its own order.
IN_BOTH_ORDERS = ("hip_cpu-ascending", "hip_cpu-descending", "cuda")
_PARAMETER_SET = type(pytest.param())


def place_param(place: str, *values, id=None, marks=()):
    """One parameter set of gpu_place ("hip_cpu", "hip_cpu-<thread order>" or "cuda") and the test's own values,
    marked as the place is (hip_cpu, or gpu: skipped without a GPU) and with ``marks``."""
    mark = pytest.mark.gpu if place == "cuda" else pytest.mark.hip_cpu
    return pytest.param(place, *values, marks=[mark, *marks], id=id)


def on_places(places=IN_BOTH_ORDERS):
    """parametrize(gpu_place) over ``places``."""
    return pytest.mark.parametrize("gpu_place", [place_param(p, id=p) for p in places], indirect=True)


def per_place(argnames: str, cases: dict, ids=None):
    """parametrize(gpu_place and ``argnames``), each place with its own values: ``cases`` maps a gpu_place
    parameter to a list of values (a tuple each where argnames names several, or a pytest.param with marks); a
    place left out runs none. ``ids(*values)``: the id after the place's (None or "": the place's alone);
    pytest's own ids without it."""
    names = [n.strip() for n in argnames.split(",") if n.strip()]
    params = []
    for place, values in cases.items():
        for v in values:
            marks = ()
            if isinstance(v, _PARAMETER_SET):
                v, marks = v.values, v.marks
            else:
                v = tuple(v) if len(names) > 1 else (v,)
            params.append(place_param(place, *v, marks=marks,
                                      id=None if ids is None else "-".join(filter(None, [place, ids(*v)]))))
    return pytest.mark.parametrize(["gpu_place"] + names, params, indirect=["gpu_place"])


def in_both_orders(hip_cpu_values, cuda_values) -> dict:
    """per_place's cases: the HIP CPU build's in both thread orders, and the GPU's."""
    return {"hip_cpu-ascending": hip_cpu_values, "hip_cpu-descending": hip_cpu_values, "cuda": cuda_values}


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
