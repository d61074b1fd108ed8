"""Shared state of a run (device, dtypes, timing plan, the torch.mm yardstick) and helpers used by workloads."""
import contextlib
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import numpy as np
import torch

from spconv.benchmark.baseline import MMBaseline
from spconv.benchmark.flops import ConvLayer, total_flops
from spconv.benchmark.results import Measurement, Record
from spconv.benchmark.timing import Plan, Stats

DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16,
          "fp64": torch.float64}


@dataclass
class Task:
    """One unit of work under the progress bar."""

    label: str
    run: Callable[[], None]


@dataclass
class Context:
    device: torch.device
    dtypes: List[str]
    plan: Plan
    record: Record
    quick: bool = False
    full: bool = False
    with_cpu_route: bool = False
    data: Optional[str] = None  # --data FILE.npz (voxels)
    points: Optional[str] = None  # --points FILE.npz (raw sweep)
    seed: int = 0
    _mm: Dict[str, MMBaseline] = field(default_factory=dict)

    def mm(self, device: torch.device, dtype_name: str) -> MMBaseline:
        key = f"{device}/{dtype_name}"
        if key not in self._mm:
            # Host runs time the yardstick with the host plan, device runs with the device plan.
            plan = self.plan if device.type == self.device.type else Plan(1, 3)
            self._mm[key] = MMBaseline(device, DTYPES[dtype_name], plan)
        return self._mm[key]

    def note(self, text: str):
        if text not in self.record.notes:
            self.record.notes.append(text)


@contextlib.contextmanager
def tf32_mode(dtype_name: str):
    """TF32 rows run FP32 tensors with TF32 tensor-core math allowed (NVIDIA only)."""
    from spconv import constants
    old = (constants.SPCONV_ALLOW_TF32, torch.backends.cuda.matmul.allow_tf32)
    on = dtype_name == "tf32"
    constants.SPCONV_ALLOW_TF32 = on
    torch.backends.cuda.matmul.allow_tf32 = on
    try:
        yield
    finally:
        constants.SPCONV_ALLOW_TF32, torch.backends.cuda.matmul.allow_tf32 = old


def measurement(ctx: Context, workload: str, case: str, route, chosen: bool, dtype_name: str, pass_name: str,
                voxels: int, layers: List[ConvLayer], stats: Stats, with_mm: bool = True) -> Measurement:
    """A Measurement with its FLOPs and, measured now, torch.mm's time on the same FLOPs."""
    mm_ms = peak = None
    if with_mm and layers:
        mm_dtype = "fp32" if dtype_name == "tf32" else dtype_name
        with tf32_mode(dtype_name):
            baseline = ctx.mm(route.device, mm_dtype)
            mm_ms, peak = baseline.pass_ms(layers, pass_name), baseline.peak_gflops()
        key = f"{route.device.type}/{dtype_name}"
        ctx.record.meta.setdefault("peak_gflops", {})[key] = round(peak, 2)
        ctx.record.meta.setdefault("peak_sources", {})[key] = {k: round(v, 2) for k, v in baseline.peak_parts.items()}
    m = Measurement(workload=workload, case=case, route=route.name, chosen=chosen, dtype=dtype_name,
                    pass_name=pass_name, voxels=int(voxels), flops=total_flops(layers, pass_name),
                    median_ms=stats.median, min_ms=stats.min, max_ms=stats.max, iters=len(stats.samples_ms),
                    mm_ms=mm_ms, peak_gflops=peak, busy_ms=stats.busy.median if stats.busy is not None else None,
                    samples_ms=[round(s, 4) for s in stats.samples_ms],
                    busy_samples_ms=[round(s, 4) for s in stats.busy.samples_ms] if stats.busy is not None else [])
    ctx.record.measurements.append(m)
    return m


def fixed_grad(seed: int = 1):
    """A deterministic upstream gradient shaped like the output (drawn once per shape)."""
    cache: Dict[tuple, torch.Tensor] = {}

    def grad(out: torch.Tensor) -> torch.Tensor:
        key = (tuple(out.shape), out.dtype, str(out.device))
        if key not in cache:
            gen = torch.Generator(device="cpu").manual_seed(seed)
            cache[key] = torch.randn(*out.shape, generator=gen).to(out.device, out.dtype)
        return cache[key]

    return grad


def sparse_tensor(sp, features: np.ndarray, indices: np.ndarray, shape, device, dtype, requires_grad=False):
    f = torch.from_numpy(np.ascontiguousarray(features)).to(device, dtype)
    if requires_grad:
        f.requires_grad_(True)
    i = torch.from_numpy(np.ascontiguousarray(indices, dtype=np.int32)).to(device)
    return sp.SparseConvTensor(f, i, list(shape), 1)


def fmt_count(n: float) -> str:
    """1e4 -> "10k", 125562 -> "126k", 1e6 -> "1.0M"."""
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.0f}k"
    return str(int(n))
