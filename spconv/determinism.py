"""Deterministic mode: bitwise-reproducible forward and gradients, run to run and across thread counts.

Every route is deterministic by construction, so the flag has no slower kernel to select and changes nothing:
the CPU route uses fixed chunking, a single-threaded GEMM per chunk and offsets and dfilter partial sums
reduced in a fixed order; the GPU routes add no floating-point numbers with atomics (outputs written once,
fixed-order split-K dfilter, one kernel offset per scatter, ``sparse_add`` in rounds). The switch exists so
that code asking for determinism (spconv's or torch's) can check that it holds.
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
