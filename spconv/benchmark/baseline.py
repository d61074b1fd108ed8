"""The dense yardstick: torch.mm on exactly the useful FLOPs of a workload, measured in the same run.

For a conv layer with P pairs the forward does the work of one (P x Cin) @ (Cin x Cout) product; backward that
of dW = (Cin x P) @ (P x Cout) and, when the input needs a gradient, dX = (P x Cout) @ (Cout x Cin). A ratio of
1.0 means the sparse route runs as fast as the vendor GEMM would on the same arithmetic with no gather/scatter.
"""
from typing import Dict, List, Tuple

import torch

from spconv.benchmark.flops import ConvLayer
from spconv.benchmark.timing import Plan, time_fn

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


class MMBaseline:
    """Times each distinct product once (median of a plan) and sums them per workload pass."""

    def __init__(self, device: torch.device, dtype: torch.dtype, plan: Plan):
        self.device, self.dtype, self.plan = device, dtype, plan
        self._ms: Dict[Shape, float] = {}

    def product_ms(self, shape: Shape) -> float:
        if shape not in self._ms:
            m, k, n = shape
            if m * k * n == 0:
                self._ms[shape] = 0.0
            else:
                # Drawn on the device: a 1e6-voxel layer's gathered operand can hold billions of values.
                gen = torch.Generator(device=self.device).manual_seed(0)
                a = torch.randn(m, k, generator=gen, device=self.device).to(self.dtype)
                b = torch.randn(k, n, generator=gen, device=self.device).to(self.dtype)
                self._ms[shape] = time_fn(lambda: torch.mm(a, b), self.device, self.plan).median
                del a, b
        return self._ms[shape]

    def pass_ms(self, layers: List[ConvLayer], pass_name: str) -> float:
        return sum(self.product_ms(s) for layer in layers for s in mm_shapes(layer, pass_name))
