"""Timing loops: host clocks on CPU, device events on GPU.

Standalone on purpose (torch only): the compare worker times the other implementation with the same code.
"""
import contextlib
import os
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import torch


@dataclass(frozen=True)
class Plan:
    """How many untimed warm-ups and timed iterations one measurement runs."""

    warmup: int
    iters: int

    def describe(self) -> str:
        return f"{self.warmup} warm-up, {self.iters} timed iterations"


# GPU: the floor (>= 10 warm-ups, >= 50 timed iterations, device events).
GPU_PLAN = Plan(10, 50)
# CPU: a forward of the basic network takes seconds on a laptop-class CPU, so far fewer; stated in the output.
CPU_PLAN = Plan(1, 3)
CPU_QUICK_PLAN = Plan(1, 2)


def default_plan(device: torch.device, quick: bool = False) -> Plan:
    if device.type == "cuda":
        return GPU_PLAN
    return CPU_QUICK_PLAN if quick else CPU_PLAN


@dataclass
class Stats:
    """Per-iteration times in milliseconds."""

    samples_ms: List[float] = field(default_factory=list)
    busy: Optional["Stats"] = None  # the same measurement with the busy load running (--busy)

    @property
    def median(self) -> float:
        return statistics.median(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def min(self) -> float:
        return min(self.samples_ms) if self.samples_ms else float("nan")

    @property
    def max(self) -> float:
        return max(self.samples_ms) if self.samples_ms else float("nan")

    def to_dict(self) -> Dict[str, object]:
        d = {"median_ms": self.median, "min_ms": self.min, "max_ms": self.max, "samples_ms": self.samples_ms}
        if self.busy is not None:
            d["busy"] = self.busy.to_dict()
        return d


class BusyLoad:
    """``n`` CPU-bound processes (``while 1: pass``, as a DataLoader's workers keep cores busy), started once and
    kept stopped (SIGSTOP) except while a measurement's busy pass runs: every timed row is measured quiet, then
    busy, in the same run."""

    def __init__(self, n: int):
        self.procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(n)]
        self._signal(signal.SIGSTOP)

    def _signal(self, sig):
        for p in self.procs:
            os.kill(p.pid, sig)

    @contextlib.contextmanager
    def running(self):
        self._signal(signal.SIGCONT)
        time.sleep(0.05)  # let the scheduler see them
        try:
            yield
        finally:
            self._signal(signal.SIGSTOP)

    def close(self):
        for p in self.procs:
            p.kill()
            p.wait()


_BUSY: Optional[BusyLoad] = None


@contextlib.contextmanager
def busy_load(n: int):
    """While active, time_fn and time_train_step also time each measurement under ``n`` busy processes."""
    global _BUSY
    if n <= 0:
        yield
        return
    _BUSY = BusyLoad(n)
    try:
        yield
    finally:
        _BUSY.close()
        _BUSY = None


class Clock:
    """Marks points in time on the device's own timeline; ``elapsed`` waits for the device."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"

    def mark(self):
        if self.cuda:
            ev = torch.cuda.Event(enable_timing=True)
            ev.record()
            return ev
        return time.perf_counter()

    def elapsed_ms(self, start, end) -> float:
        if self.cuda:
            end.synchronize()
            return start.elapsed_time(end)
        return (end - start) * 1e3

    def sync(self):
        if self.cuda:
            torch.cuda.synchronize()


def time_fn(fn: Callable[[], object], device: torch.device, plan: Plan,
            on_iter: Optional[Callable[[], None]] = None) -> Stats:
    """Times ``fn()`` end to end: ``plan.warmup`` untimed calls, then ``plan.iters`` timed ones (and, with a busy
    load active, the same again under it: ``.busy``)."""
    stats = _time_fn(fn, device, plan, on_iter)
    if _BUSY is not None:
        with _BUSY.running():
            stats.busy = _time_fn(fn, device, plan, on_iter)
    return stats


def quiet_time_fn(fn: Callable[[], object], device: torch.device, plan: Plan) -> Stats:
    """As time_fn, but never under the busy load (measurements of the machine itself, such as its peak)."""
    return _time_fn(fn, device, plan, None)


def forget_region_waits():
    """Each measurement starts as on a machine that has not been busy: the native route's CPU regions remember
    recent waits on late threads for a few hundred ms (csrc/native/region_stalls.h), which would carry a busy
    pass into the quiet pass of the next row. A no-op where the op is absent (another implementation)."""
    try:
        torch.ops.spconv_debug.cpu_parallel_region_set_budget(0)
    except (AttributeError, RuntimeError):
        pass


def _time_fn(fn, device, plan, on_iter) -> Stats:
    clock = Clock(device)
    forget_region_waits()
    for _ in range(plan.warmup):
        fn()
    clock.sync()
    stats = Stats()
    for _ in range(plan.iters):
        t0 = clock.mark()
        fn()
        t1 = clock.mark()
        stats.samples_ms.append(clock.elapsed_ms(t0, t1))
        if on_iter is not None:
            on_iter()
    return stats


def time_train_step(forward: Callable[[], torch.Tensor], grad: Callable[[torch.Tensor], torch.Tensor],
                    device: torch.device, plan: Plan, zero_grad: Callable[[], None],
                    on_iter: Optional[Callable[[], None]] = None) -> Dict[str, Stats]:
    """Forward with autograd, then backward, timed separately within each iteration.

    Returns ``{"forward_train", "backward", "forward_backward"}`` (each with ``.busy`` under a busy load).
    """
    rec = _time_train_step(forward, grad, device, plan, zero_grad, on_iter)
    if _BUSY is not None:
        with _BUSY.running():
            busy = _time_train_step(forward, grad, device, plan, zero_grad, on_iter)
        for k in rec:
            rec[k].busy = busy[k]
    return rec


def _time_train_step(forward, grad, device, plan, zero_grad, on_iter) -> Dict[str, Stats]:
    clock = Clock(device)
    forget_region_waits()

    def step(record: Optional[Dict[str, Stats]]):
        zero_grad()
        t0 = clock.mark()
        out = forward()
        t1 = clock.mark()
        out.backward(grad(out))
        t2 = clock.mark()
        if record is not None:
            f, b = clock.elapsed_ms(t0, t1), clock.elapsed_ms(t1, t2)
            record["forward_train"].samples_ms.append(f)
            record["backward"].samples_ms.append(b)
            record["forward_backward"].samples_ms.append(f + b)

    for _ in range(plan.warmup):
        step(None)
    clock.sync()
    rec = {"forward_train": Stats(), "backward": Stats(), "forward_backward": Stats()}
    for _ in range(plan.iters):
        step(rec)
        if on_iter is not None:
            on_iter()
    return rec
