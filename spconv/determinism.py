"""Deterministic mode: bitwise-reproducible forward and gradients, run to run and across thread counts.

On the CPU the native route is always deterministic (fixed chunking, single-threaded GEMM per chunk, offsets
and dfilter partial sums reduced in a fixed order), so the flag changes nothing there. GPU routes consult
``is_deterministic()`` to pick kernels without floating-point atomics (fixed-order dfilter reduction).
"""
import torch

_deterministic = False


def set_deterministic(mode: bool = True) -> None:
    """Ask every spconv route for bitwise-reproducible results (also on under
    ``torch.use_deterministic_algorithms(True)``)."""
    global _deterministic
    _deterministic = bool(mode)


def is_deterministic() -> bool:
    """True when ``set_deterministic(True)`` was called or torch's deterministic algorithms are on."""
    return _deterministic or torch.are_deterministic_algorithms_enabled()
