"""Loads the compiled extension and owns the route policy (fused GPU route vs native route).

The Python layers reach the operators through ``ops`` (never ``torch.ops.spconv`` directly): normally the
``torch.ops.spconv`` library, and inside ``gpu_code_on_cpu`` (tests only) the HIP CPU build of the GPU code,
whose operators run the GPU glue and kernels on CPU tensors (see tools/hip_cpu_build.py).
"""
import contextlib
import json
from typing import Dict, Iterator

import torch

from spconv import constants

try:
    from spconv import _C_hip  # noqa: F401  (importing registers the torch.ops.spconv operators)
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "spconv._C_hip is not built. Install with `pip install --no-build-isolation -e .` "
        "(it must be compiled against the installed torch)") from e

_INFO = json.loads(torch.ops.spconv.build_info())  # the normal extension, whatever ``ops`` points at


def build_info() -> Dict[str, object]:
    """What the extension was compiled with: backends, GPU archs, compiler, torch version."""
    info = dict(_INFO)
    info["torch_runtime"] = torch.__version__
    info["gpu_available"] = bool(torch.cuda.is_available()) and info["gpu_backend"] != "none"
    info["force_native"] = constants.SPCONV_FORCE_NATIVE
    return info


def has_gpu_kernels() -> bool:
    return _INFO["gpu_backend"] != "none"


class _OpLibrary:
    """``torch.ops.<namespace>`` of the selected op library, looked up at each call."""

    def __init__(self, namespace: str):
        self.namespace = namespace

    def __getattr__(self, name: str):
        return getattr(getattr(torch.ops, self.namespace), name)


ops = _OpLibrary("spconv")
# The diagnostics (counters, budgets, benchmark loops: csrc/ops/debug_schema.cpp), apart from the user's operators.
debug_ops = _OpLibrary("spconv_debug")


def debug_library(lib):
    """The diagnostics' op library beside ``lib`` (a ``torch.ops.<namespace>``, or a namespace name):
    ``torch.ops.<namespace>_debug`` (host_copy_count, and the HIP CPU build's debug_launch_ledger)."""
    return getattr(torch.ops, (lib if isinstance(lib, str) else lib.name) + "_debug")
_gpu_code_on_cpu = False  # CPU tensors take the GPU route (through the HIP CPU build in ``ops``)
_library_hooks = []
_libraries = ["spconv"]  # every op library selected so far


def on_op_library(hook) -> None:
    """Runs ``hook(namespace)`` for every op library, now and when one is first selected: the per-namespace
    Python registrations (autograd formulas) live with the wrappers that need them."""
    _library_hooks.append(hook)
    for ns in _libraries:
        hook(ns)


def register_fake(name: str):
    """Decorator: the fake kernel (torch.compile / torch.export) of operator ``name`` in every op library,
    so that the test builds trace like the spconv library."""
    def decorate(fn):
        on_op_library(lambda ns: torch.library.register_fake("%s::%s" % (ns, name), fn))
        return fn
    return decorate


def runs_gpu_code(device: torch.device) -> bool:
    """Whether tensors on ``device`` go through the GPU glue: on a GPU, or on the CPU inside gpu_code_on_cpu."""
    return device.type == "cuda" or (_gpu_code_on_cpu and device.type == "cpu")


def fused_route_enabled(device: torch.device) -> bool:
    """The fused gather-GEMM-scatter route runs only on a GPU, with GPU kernels built, unless forced off."""
    if constants.SPCONV_FORCE_NATIVE:
        return False
    return (device.type == "cuda" and has_gpu_kernels()) or (_gpu_code_on_cpu and device.type == "cpu")


@contextlib.contextmanager
def gpu_code_on_cpu(namespace: str = "spconv_hipcpu") -> Iterator[_OpLibrary]:
    """Tests only: CPU tensors take the GPU route through the op library ``torch.ops.<namespace>`` (a HIP CPU
    build loaded with ``torch.ops.load_library``): kernel maps, fused and native convolutions, pooling,
    voxelization and hash tables all run the GPU glue and kernels. SPCONV_FORCE_NATIVE keeps its meaning
    (native GPU route). Not thread-safe; restores the previous library on exit."""
    global _gpu_code_on_cpu
    getattr(torch.ops, namespace).build_info  # raises now if the library is not loaded
    if namespace not in _libraries:
        _libraries.append(namespace)
        for hook in _library_hooks:
            hook(namespace)
    old = ops.namespace, _gpu_code_on_cpu
    ops.namespace, _gpu_code_on_cpu = namespace, True
    try:
        yield ops
    finally:
        ops.namespace, _gpu_code_on_cpu = old
