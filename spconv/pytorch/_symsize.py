"""Sizes that may be symbolic: under torch.export / torch.compile the voxel counts of kernel maps are unbacked
SymInts (data-dependent), so checks and branches on them must not force a Python int. Eager mode sees plain
ints and pays nothing."""
from typing import Union

import torch
from torch.fx.experimental.symbolic_shapes import guard_or_false, guard_or_true

Size = Union[int, torch.SymInt]


def as_size(v) -> Size:
    """An int, or the SymInt itself while tracing (``int()`` of an unbacked size would stop the trace)."""
    return v if isinstance(v, (int, torch.SymInt)) else int(v)


def check_equal(actual: Size, expected: Size, what: str) -> None:
    """ValueError naming both sizes when they differ; while tracing, a runtime assertion (message ``what``,
    which must not depend on the sizes) when it can't be decided."""
    if type(actual) is int and type(expected) is int and not torch.compiler.is_compiling():
        # eager mode: nothing to record (Dynamo reports a traced SymInt's type as int, hence the last test)
        if actual != expected:
            raise ValueError(f"{what}: expected {expected}, got {actual}")
        return
    if guard_or_false(actual != expected):
        raise ValueError(f"{what}: expected {expected}, got {actual}")
    if torch.compiler.is_dynamo_compiling():
        torch._check(actual == expected)  # Dynamo before torch 2.13 can't trace a message that is a closure
    else:
        torch._check(actual == expected, lambda: what)


def maybe_nonzero(n: Size) -> bool:
    """``n != 0``; True while tracing when undecided (running a row-wise module on zero rows is harmless in
    inference, skipping it would need a graph branch)."""
    return guard_or_true(n != 0)


def surely_zero(n: Size) -> bool:
    """``n == 0``; False while tracing when undecided."""
    return guard_or_false(n == 0)
