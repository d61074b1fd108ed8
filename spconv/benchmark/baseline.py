"""The dense yardstick: torch.mm on exactly the useful FLOPs of a workload, measured in the same run.

For a conv layer with P pairs the forward does the work of one (P x Cin) @ (Cin x Cout) product; backward that
of dW = (Cin x P) @ (P x Cout) and, when the input needs a gradient, dX = (P x Cout) @ (Cout x Cin). A ratio of
1.0 means the sparse route runs as fast as the vendor GEMM would on the same arithmetic with no gather/scatter.
"""
from typing import Dict, List, Optional, Tuple

import torch

from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.timing import Plan, quiet_time_fn, time_fn

Shape = Tuple[int, int, int]  # (m, k, n) of an (m x k) @ (k x n) product


def mm_shapes(layer: ConvLayer, pass_name: str) -> List[Shape]:
    fwd = [(layer.pairs, layer.cin, layer.cout)]
    bwd = [(layer.cin, layer.pairs, layer.cout)]
    if layer.input_grad:
        bwd.append((layer.pairs, layer.cout, layer.cin))
    if pass_name in ("forward", "forward_train"):
        return fwd
    if pass_name == "backward":
        return bwd
    return fwd + bwd


# On a CPU, products are timed on at most this many rows (or reduction length) and scaled linearly: GEMM
# throughput is flat well before that size, and timing the basic network's full 180 GFLOP would take longer
# than the network itself. On a GPU every product is timed whole.
CPU_ROW_CAP = 1 << 15
PEAK_SIZE = 2048
PEAK_ITERS = 7


class MMBaseline:
    """Times each distinct product once (median of a plan) and sums them per workload pass."""

    def __init__(self, device: torch.device, dtype: torch.dtype, plan: Plan):
        self.device, self.dtype, self.plan = device, dtype, plan
        self.row_cap = CPU_ROW_CAP if device.type == "cpu" else None
        self._ms: Dict[Shape, float] = {}
        self._peak: Optional[float] = None
        self.peak_parts: Dict[str, float] = {}  # what the peak is the best of (source -> GFLOP/s)

    def _operands(self, m: int, k: int, n: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """Seeded random (m x k) and (k x n) operands, drawn on the device: a 1e6-voxel layer's gathered operand
        can hold billions of values."""
        gen = torch.Generator(device=self.device).manual_seed(0)
        a = torch.randn(m, k, generator=gen, device=self.device).to(self.dtype)
        b = torch.randn(k, n, generator=gen, device=self.device).to(self.dtype)
        return a, b

    def product_ms(self, shape: Shape) -> float:
        if shape not in self._ms:
            m, k, n = shape
            if m * k * n == 0:
                self._ms[shape] = 0.0
                return 0.0
            # Cap the long dimension (the pair count: m for forward and dX, k for dW) and scale back up.
            long_axis = 0 if m >= k else 1
            dims = [m, k, n]
            scale = 1.0
            if self.row_cap is not None and dims[long_axis] > self.row_cap:
                scale = dims[long_axis] / self.row_cap
                dims[long_axis] = self.row_cap
            a, b = self._operands(*dims)
            self._ms[shape] = time_fn(lambda: torch.mm(a, b), self.device, self.plan).median * scale
            del a, b
        return self._ms[shape]

    def peak_gflops(self) -> float:
        """The yardstick of 'fraction of peak': the best of the machine's rate on a large square product (2048^3)
        and, on the CPU in FP32/FP64, the measured FMA loop on the vector width the native kernels use. A vendor
        BLAS can run its AVX2 path on an AVX-512 core (MKL on AMD Zen 4/5: half the FMA peak), and a fraction of
        that would read above 1. Each is the best of PEAK_ITERS timed runs, quiet (never under --busy): a peak is
        the best rate the cores reach, and on a shared machine a median of a few moved it by 20-40% between runs,
        and every row's fraction with it."""
        if self._peak is None:
            self.peak_parts = self._peak_parts()
            self._peak = max(self.peak_parts.values())
        return self._peak

    def peak_source(self) -> str:
        """Which measurement the peak is, with the others: 'FMA loop, 2 threads (torch.mm 2048^3 202 GFLOP/s)'."""
        self.peak_gflops()
        return describe_peak(self.peak_parts)

    def _peak_parts(self) -> Dict[str, float]:
        n = PEAK_SIZE
        a, b = self._operands(n, n, n)
        plan = Plan(max(self.plan.warmup, 2), max(self.plan.iters, PEAK_ITERS))
        best_ms = quiet_time_fn(lambda: torch.mm(a, b), self.device, plan).min
        parts = {"torch.mm 2048^3": 2.0 * n ** 3 / (best_ms * 1e6)}
        del a, b
        if self.device.type == "cpu" and self.dtype in (torch.float32, torch.float64):
            threads = torch.get_num_threads()
            parts[f"FMA loop, {threads} thread{'s' if threads > 1 else ''}"] = fma_loop_gflops(self.dtype, plan)
        return parts

    def pass_ms(self, layers: List[ConvLayer], pass_name: str) -> float:
        return sum(self.product_ms(s) for layer in layers for s in mm_shapes(layer, pass_name))


def describe_peak(parts: Dict[str, float]) -> str:
    best = max(parts, key=parts.get)
    others = [f"{k} {v:.0f} GFLOP/s" for k, v in parts.items() if k != best]
    return best + (f" ({', '.join(others)})" if others else "")


FMA_LOOP_STEPS = 1 << 23  # steps per thread per run: about 14 ms on a 3.7 GHz AVX-512 core


def fma_loop_gflops(dtype: torch.dtype, plan: Plan, threads: Optional[int] = None) -> float:
    """The native kernels' FMA peak at ``threads`` (default: torch's) intra-op threads: the best of ``plan``'s
    timed runs of the extension's FMA chains (its widest vectors: AVX-512, AVX2/FMA or the portable loop)."""
    old = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        flops = []
        stats = quiet_time_fn(lambda: flops.append(torch.ops.spconv_debug.cpu_fma_peak_loop(FMA_LOOP_STEPS, dtype)),
                              torch.device("cpu"), plan)
        return flops[-1] / (stats.min * 1e6)
    finally:
        torch.set_num_threads(old)
