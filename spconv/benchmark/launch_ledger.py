"""Counts what a piece of GPU code costs besides its kernel bodies, on the HIP CPU build (docs/hip_cpu.md):

* ``launches``: the project's own kernels, exact (every launch goes through ``launch_kernel()``, counted by the
  build's ``debug_launch_ledger`` op, in ``torch.ops.<namespace>_debug``), plus ``aten_launches``: the ATen ops that would launch device work, from
  the profiler (the innermost ATen ops that are neither views nor allocations, and kernels such as sort or
  a reduction once, whatever their CPU implementation calls; an op that launches several kernels on a GPU,
  such as nonzero or sort, counts once, so this is a lower bound).
* ``host_waits``: the glue's device->host copies (``host_copy_count``: every one goes through ``to_host()``) and
  the ATen ops that wait for the device (``.item()``, ``nonzero``, ...). Reads of a host copy the glue made
  (``item`` inside the glue) are not counted again.
* ``allocations``: the allocator's allocations (profiler memory events of positive size).
* ``host_ms``: wall time minus the time inside ``launch_kernel`` (a second run, without the profiler) and minus
  the counted ATen ops' own time (from the profiled run; on the HIP CPU build they compute on the host): the
  glue's and the Python layers' time, what a GPU would not hide. Noisy on a busy machine.
"""
import contextlib
import os
import time
from dataclasses import asdict, dataclass
from typing import Callable, Dict, Iterable, Optional, Tuple

import torch

# Every module is counted under the profiler; kineto would print two lines per profile around the table.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# ATen ops that wait for the device (a value or a result size read on the host). aten::_local_scalar_dense is
# every .item() / int(t) / bool(t).
SYNCING_OPS = frozenset({
    "aten::item", "aten::_local_scalar_dense", "aten::nonzero", "aten::masked_select",
    "aten::unique", "aten::_unique", "aten::_unique2", "aten::unique_dim", "aten::unique_consecutive",
    "aten::bincount", "aten::repeat_interleave", "aten::is_nonzero", "aten::equal", "aten::allclose",
    "aten::tolist"})
# Reads of a host value the glue already copied (to_host) and counted.
HOST_READS = frozenset({"aten::item", "aten::_local_scalar_dense"})
# ATen ops that launch nothing by themselves: views, metadata, allocations, dtype/device dispatch wrappers
# (their inner copy_ counts), scalar reads (a copy, counted as a host wait instead).
NO_LAUNCH = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided",
    "aten::view", "aten::_unsafe_view", "aten::reshape", "aten::_reshape_alias", "aten::as_strided",
    "aten::as_strided_", "aten::slice", "aten::select", "aten::narrow", "aten::t", "aten::transpose",
    "aten::permute", "aten::unsqueeze", "aten::squeeze", "aten::expand", "aten::expand_as", "aten::view_as",
    "aten::detach", "aten::detach_", "aten::alias", "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg",
    "aten::split", "aten::split_with_sizes", "aten::chunk", "aten::unbind", "aten::unflatten", "aten::flatten",
    "aten::contiguous", "aten::to", "aten::_to_copy", "aten::resize_", "aten::set_", "aten::result_type",
    "aten::size", "aten::stride", "aten::numel", "aten::dim", "aten::is_contiguous", "aten::item",
    "aten::_local_scalar_dense", "aten::cpu", "aten::clone", "aten::zeros_like", "aten::zeros",
    "aten::ones", "aten::ones_like", "aten::full", "aten::full_like", "aten::new_zeros", "aten::new_full",
    "aten::_has_compatible_shallow_copy_type", "aten::requires_grad_", "aten::_version", "aten::unfold",
    "aten::diagonal", "aten::movedim", "aten::moveaxis", "aten::swapaxes", "aten::indices", "aten::values",
    "aten::unsqueeze_", "aten::squeeze_", "aten::t_", "aten::transpose_", "aten::resize_as_", "aten::scalar_tensor",
    "aten::empty_permuted"})
# Kernels whose CPU implementation calls other ATen ops (sort copies its input, min squeezes its result, sum
# fills its output, ...): one launch each, whatever the CPU calls inside. nonzero_static has a fixed size and
# does not wait.
ONE_LAUNCH = frozenset({
    "aten::sort", "aten::argsort", "aten::topk", "aten::min", "aten::max", "aten::amin", "aten::amax",
    "aten::argmin", "aten::argmax", "aten::sum", "aten::mean", "aten::prod", "aten::any", "aten::all",
    "aten::cumsum", "aten::cumprod", "aten::nonzero", "aten::nonzero_static", "aten::index", "aten::norm",
    "aten::linalg_vector_norm"})
# Composite ops above (clone, zeros, ...) launch through their children (copy_, fill_), counted there.


@dataclass
class Tally:
    launches: int = 0  # the project's kernels (exact)
    aten_launches: int = 0
    host_waits: int = 0
    glue_copies: int = 0  # of host_waits: the glue's to_host copies
    allocations: Optional[int] = None  # whole calls only
    wall_ms: float = 0.0
    kernel_ms: float = 0.0  # inside launch_kernel (launch, body, the runtime's synchronisation)
    aten_ms: float = 0.0  # in the counted ATen ops (device work on a GPU; from the profiled run)

    @property
    def total_launches(self) -> int:
        return self.launches + self.aten_launches

    @property
    def host_ms(self) -> float:
        """Wall time outside the project's kernels and the ATen ops' own work (0 when not timed)."""
        return max(self.wall_ms - self.kernel_ms - self.aten_ms, 0.0) if self.wall_ms else 0.0

    def to_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d.update(total_launches=self.total_launches, host_ms=round(self.host_ms, 3), wall_ms=round(self.wall_ms, 3),
                 kernel_ms=round(self.kernel_ms, 3), aten_ms=round(self.aten_ms, 3))
        return d


def _launches_below(ev) -> Tuple[int, float]:
    """(device launches, their microseconds) of an event's subtree: an op that does work counts once unless its
    children do."""
    if ev.name in ONE_LAUNCH:
        return 1, ev.time_range.elapsed_us()
    inner = [_launches_below(c) for c in ev.cpu_children]
    n = sum(c for c, _ in inner)
    if n:
        return n, sum(us for _, us in inner)
    if ev.name.startswith("aten::") and ev.name not in NO_LAUNCH:
        return 1, ev.time_range.elapsed_us()
    return 0, 0.0


def _walk(ev) -> Iterable:
    yield ev
    for c in ev.cpu_children:
        yield from _walk(c)


def count_events(roots, namespace: str) -> Dict[str, int]:
    """aten_launches and syncing ATen ops under the given profiler events (FunctionEvents) and their subtrees."""
    glue = namespace + "::"
    launches = syncs = 0
    aten_us = 0.0

    def visit(ev, inside_sync: bool, inside_glue: bool):
        nonlocal syncs
        is_sync = ev.name in SYNCING_OPS
        # item -> _local_scalar_dense is one wait; the glue reading its own host copy (to_host) is none.
        if is_sync and not inside_sync and not (inside_glue and ev.name in HOST_READS):
            syncs += 1
        for c in ev.cpu_children:
            visit(c, inside_sync or is_sync, inside_glue or ev.name.startswith(glue))

    for r in roots:
        n, us = _launches_below(r)
        launches += n
        aten_us += us
        visit(r, False, False)
    return {"aten_launches": launches, "syncs": syncs, "aten_ms": aten_us / 1e3}


SCOPE_PREFIX = "ledger::"


class Ledger:
    """Counters of one HIP CPU op library (``torch.ops.<namespace>``), for a whole call and for named scopes
    inside it (``with ledger.scope("map"):`` around a part, such as the kernel-map builder)."""

    def __init__(self, lib):
        from spconv import _backend

        self.debug = _backend.debug_library(lib)
        if not hasattr(self.debug, "debug_launch_ledger"):
            raise ValueError(f"op library {lib.name} has no debug_launch_ledger in {self.debug.name}: not a HIP CPU "
                             "build")
        self.lib = lib
        self.namespace = lib.name
        self._scopes: Dict[str, list] = {}

    def settle(self):
        """Reads the checks still pending from earlier calls (submanifold maps' statuses wait for the next host
        read), so that a count or a time holds the work of its own call only."""
        self.debug.debug_check_pending_maps()

    def _read(self):
        launches, body_ns = self.debug.debug_launch_ledger()
        return launches, body_ns, self.debug.host_copy_count(), time.perf_counter_ns()

    @contextlib.contextmanager
    def scope(self, name: str):
        a = self._read()
        with torch.profiler.record_function(SCOPE_PREFIX + name):
            yield
        b = self._read()
        acc = self._scopes.setdefault(name, [0, 0, 0, 0])
        for i in range(4):
            acc[i] += b[i] - a[i]

    def count(self, fn: Callable[[], object]) -> Tuple[Tally, Dict[str, Tally], object]:
        """Runs ``fn`` once under the profiler: the tally of the call and of each scope entered in it."""
        from torch.profiler import ProfilerActivity, profile
        self._scopes = {}
        self.settle()
        l0, _, c0, _ = self._read()
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
            result = fn()
        l1, _, c1, _ = self._read()
        events = prof.events()
        ev = count_events([e for e in events if e.cpu_parent is None], self.namespace)
        allocs = sum(1 for e in prof.profiler.kineto_results.events() if e.name() == "[memory]" and e.nbytes() > 0)
        total = Tally(launches=l1 - l0, aten_launches=ev["aten_launches"], host_waits=(c1 - c0) + ev["syncs"],
                      glue_copies=c1 - c0, allocations=allocs, aten_ms=ev["aten_ms"])
        scopes = {}
        for name, (launches, _, copies, _) in self._scopes.items():
            sev = count_events([e for e in events if e.name == SCOPE_PREFIX + name], self.namespace)
            scopes[name] = Tally(launches=launches, aten_launches=sev["aten_launches"],
                                 host_waits=copies + sev["syncs"], glue_copies=copies, aten_ms=sev["aten_ms"])
        return total, scopes, result

    def time(self, fn: Callable[[], object]) -> Tuple[Tuple[float, float], Dict[str, Tuple[float, float]], object]:
        """Runs ``fn`` once without the profiler: (wall ms, ms inside launch_kernel) of the call and per scope."""
        self._scopes = {}
        self.settle()
        _, b0, _, t0 = self._read()
        result = fn()
        _, b1, _, t1 = self._read()
        scopes = {name: (acc[3] / 1e6, acc[1] / 1e6) for name, acc in self._scopes.items()}
        return ((t1 - t0) / 1e6, (b1 - b0) / 1e6), scopes, result

    def measure(self, fn: Callable[[], object], timed: bool = True) -> Tuple[Tally, Dict[str, Tally]]:
        """``count(fn)``, then ``time(fn)`` (fn must start from fresh state each call) merged into the tallies."""
        total, scopes, _ = self.count(fn)
        if timed:
            (total.wall_ms, total.kernel_ms), tscopes, _ = self.time(fn)
            for name, (wall, kern) in tscopes.items():
                if name in scopes:
                    scopes[name].wall_ms, scopes[name].kernel_ms = wall, kern
        return total, scopes


def load_hip_cpu(variant: str = "simt", repo: Optional[str] = None):
    """torch.ops.<namespace> of a HIP CPU build (tools/hip_cpu_build.py of a source checkout), built if needed."""
    import os
    import sys
    repo = repo or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    tools = os.path.join(repo, "tools")
    if not os.path.isfile(os.path.join(tools, "hip_cpu_build.py")):
        raise RuntimeError(f"the launch ledger needs a source checkout (tools/hip_cpu_build.py under {repo})")
    if tools not in sys.path:
        sys.path.insert(0, tools)
    import hip_cpu_build
    why = hip_cpu_build.missing_requirements()
    if why:
        raise RuntimeError("the launch ledger runs the GPU code on the HIP CPU build: " + why)
    import spconv._backend  # noqa: F401  (the normal extension first)
    built = hip_cpu_build.load(variant)
    return getattr(torch.ops, built.namespace)
