"""Which feature routes exist on a device, which one the dispatcher picks, and how to force one."""
import contextlib
from dataclasses import dataclass
from typing import List

import torch

from spconv import _backend, constants


@dataclass(frozen=True)
class Route:
    name: str  # "fused", "native" (on a GPU) or "cpu" (the native route on the host)
    device: torch.device
    force_native: bool


def chosen_route_name(device: torch.device) -> str:
    """What a plain model call runs on ``device`` (the dispatcher's choice)."""
    if device.type == "cpu":
        return "cpu"
    return "fused" if _backend.fused_route_enabled(device) else "native"


def available_routes(device: torch.device, with_cpu: bool = False) -> List[Route]:
    """The routes worth timing on ``device``, the chosen one first. On a GPU: fused (when built), native,
    and with ``with_cpu`` the host's native route too."""
    if device.type == "cpu":
        return [Route("cpu", device, False)]
    routes = []
    if _backend.has_gpu_kernels() and not constants.SPCONV_FORCE_NATIVE:
        routes.append(Route("fused", device, False))
    routes.append(Route("native", device, True))
    if with_cpu:
        routes.append(Route("cpu", torch.device("cpu"), False))
    return routes


@contextlib.contextmanager
def forced_native(on: bool):
    """Temporarily sets SPCONV_FORCE_NATIVE (read by the dispatcher at every call)."""
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = bool(on) or old
    try:
        yield
    finally:
        constants.SPCONV_FORCE_NATIVE = old
