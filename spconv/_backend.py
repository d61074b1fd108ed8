"""Loads the compiled extension and owns the route policy (fused GPU route vs native route)."""
import json
from typing import Dict

import torch

from spconv import constants

try:
    from spconv import _C_hip  # noqa: F401  (importing registers the torch.ops.spconv operators)
except ImportError as e:  # pragma: no cover - only without a build
    raise ImportError(
        "spconv._C_hip is not built. Install with `pip install --no-build-isolation -e .` "
        "(it must be compiled against the installed torch)") from e

_INFO = json.loads(torch.ops.spconv.build_info())


def build_info() -> Dict[str, object]:
    """What the extension was compiled with: backends, GPU archs, compiler, torch version."""
    info = dict(_INFO)
    info["torch_runtime"] = torch.__version__
    info["gpu_available"] = bool(torch.cuda.is_available()) and info["gpu_backend"] != "none"
    info["force_native"] = constants.SPCONV_FORCE_NATIVE
    return info


def has_gpu_kernels() -> bool:
    return _INFO["gpu_backend"] != "none"


def fused_route_enabled(device: torch.device) -> bool:
    """The fused gather-GEMM-scatter route runs only on a GPU, with GPU kernels built, unless forced off."""
    return device.type == "cuda" and has_gpu_kernels() and not constants.SPCONV_FORCE_NATIVE
