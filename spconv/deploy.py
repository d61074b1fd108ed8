"""Deployment helpers: torch.export of a sparse network and the pieces a C++ program needs.

``cmake_prefix_path`` goes into CMAKE_PREFIX_PATH (beside ``torch.utils.cmake_prefix_path``) so that
``find_package(Spconv)`` finds the op library (target ``spconv::ops``). ``checksum`` is the bit-exact digest
the C++ example (examples/cpp_deploy) prints for each output, so the two runs can be compared.
"""
import contextlib
import os
from typing import Iterator, Optional, Sequence

import numpy as np
import torch

cmake_prefix_path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "share", "cmake")

_CHECKSUM_PERIOD = 1000003  # position weights repeat after this many elements (keeps the products in uint64)


def export(model: torch.nn.Module, features: torch.Tensor, indices: torch.Tensor, *extra,
           min_voxels: int = 1, max_voxels: Optional[int] = None) -> torch.export.ExportedProgram:
    """``torch.export.export(model, (features, indices, *extra))`` with the voxel count (dim 0 of both)
    dynamic; ``extra`` (e.g. a batch size) is exported as a constant."""
    if not isinstance(features, torch.Tensor) or features.dim() != 2:
        raise ValueError("features must be a 2-D tensor [num_voxels, channels]")
    if not isinstance(indices, torch.Tensor) or indices.dim() != 2:
        raise ValueError("indices must be a 2-D int32 tensor [num_voxels, 1 + ndim]")
    n = torch.export.Dim("num_voxels", min=min_voxels, max=max_voxels)
    dynamic = ({0: n}, {0: n}) + (None,) * len(extra)
    return torch.export.export(model, (features, indices) + tuple(extra), dynamic_shapes=dynamic)


@contextlib.contextmanager
def bitwise_inductor() -> Iterator[None]:
    """Inductor compiles (torch.compile's first call, AOTI packaging) inside this give eager's bits on the CPU.

    Two Inductor rewrites round differently from eager, by about an ulp: its own code for eval-mode batch norm
    (without that decomposition it calls ATen's kernel) and the pattern passes (``mm + bias`` becomes ``addmm``,
    which accumulates the bias inside the GEMM: the 1x1 convs). Not thread-safe: it edits Inductor's
    decomposition table and config for the duration."""
    from torch._inductor import decomposition
    from torch._inductor.lowering import lowerings, make_fallback
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    saved = decomposition.decompositions.pop(op, None)
    _forget_table_copies(decomposition)
    if op not in lowerings:
        # Register ATen's kernel as the lowering up front: Inductor's implicit fallback would refuse an op that
        # has a decomposition whenever the environment variable CI is set.
        make_fallback(op, override_decomp=True)
    try:
        with torch._inductor.config.patch(pattern_matcher=False):
            yield
    finally:
        if saved is not None:
            decomposition.decompositions[op] = saved
        _forget_table_copies(decomposition)


def _forget_table_copies(decomposition) -> None:
    """Inductor compiles with a copy of its decomposition table (``fast_random_decomps``, cached at the first
    compile of the process): dropped whenever the table changes, else an edit made after any earlier compile
    would not reach the next one (a model compiled before entering ``bitwise_inductor`` left batch norm
    decomposed inside it, an ulp away from eager)."""
    copy = getattr(decomposition, "fast_random_decomps", None)
    if copy is not None and hasattr(copy, "cache_clear"):
        copy.cache_clear()


def aoti_compile_and_package(ep: torch.export.ExportedProgram, package_path: str, bitwise: bool = True,
                             **kwargs) -> str:
    """``torch._inductor.aoti_compile_and_package``, inside ``bitwise_inductor`` when ``bitwise`` (the package
    then reproduces eager's outputs bit for bit on the CPU)."""
    with bitwise_inductor() if bitwise else contextlib.nullcontext():
        return torch._inductor.aoti_compile_and_package(ep, package_path=package_path, **kwargs)


def checksum(t: torch.Tensor) -> str:
    """Hex digest of a tensor's bits: sum of (32-bit word i) * (i mod 1000003 + 1), modulo 2**64.

    One changed bit changes it; the C++ example computes the same over the same words."""
    if t.element_size() % 4:
        raise ValueError(f"checksum needs a tensor of 4- or 8-byte elements, got dtype {t.dtype}")
    words = np.frombuffer(t.detach().cpu().contiguous().numpy().tobytes(), dtype=np.uint32)
    weights = (np.arange(words.size, dtype=np.uint64) % np.uint64(_CHECKSUM_PERIOD)) + np.uint64(1)
    total = int(np.sum(words.astype(np.uint64) * weights, dtype=np.uint64))
    return "%016x" % total


def checksum_lines(outputs: Sequence[torch.Tensor]) -> str:
    """The lines the C++ example prints: ``output <i> <shape> <checksum>``."""
    lines = []
    for i, t in enumerate(outputs):
        shape = "x".join(str(s) for s in t.shape)
        lines.append(f"output {i} {shape} {checksum(t)}")
    return "\n".join(lines)
