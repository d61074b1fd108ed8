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
        """The machine's rate on a large square product (2048^3): the yardstick of 'fraction of peak'. On the CPU
        it runs close to the FMA peak of the cores torch uses. The best of PEAK_ITERS timed products, quiet
        (never under --busy): a peak is the best rate the cores reach, and on a shared machine a median of a few
        moved it by 20-40% between runs, and every row's fraction with it."""
        if self._peak is None:
            n = PEAK_SIZE
            a, b = self._operands(n, n, n)
            plan = Plan(max(self.plan.warmup, 2), max(self.plan.iters, PEAK_ITERS))
            best_ms = quiet_time_fn(lambda: torch.mm(a, b), self.device, plan).min
            self._peak = 2.0 * n ** 3 / (best_ms * 1e6)
        return self._peak

    def pass_ms(self, layers: List[ConvLayer], pass_name: str) -> float:
        return sum(self.product_ms(s) for layer in layers for s in mm_shapes(layer, pass_name))
