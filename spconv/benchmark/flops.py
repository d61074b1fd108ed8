"""Useful FLOPs of sparse convolution: 2 x pairs x Cin x Cout per pass.

"Useful" counts only real (input, output) neighbour pairs, the work a perfect kernel would do; padding,
masked lanes and map building are not counted, so GFLOP/s compare routes and libraries fairly.
"""
from dataclasses import asdict, dataclass
from typing import Dict, Iterable, List, Optional


@dataclass
class ConvLayer:
    """One conv layer as run: its shape and how many neighbour pairs its kernel map had."""

    name: str
    cin: int
    cout: int
    pairs: int
    n_in: int
    n_out: int
    input_grad: bool = True  # whether backward computes dinput (the first layer's input needs none)
    # The fused route's rows computed per neighbour pair on this layer's tables (spconv/benchmark/fused_work.py):
    # split count, forward and dinput, per row tile (gathers) and per 16-row group (multiply-adds).
    fused_splits: Optional[int] = None
    fused_fwd_tile: Optional[float] = None
    fused_fwd_mma: Optional[float] = None
    fused_dx_tile: Optional[float] = None
    fused_dx_mma: Optional[float] = None

    def to_dict(self) -> Dict[str, object]:
        return asdict(self)


def conv_flops(pairs: int, cin: int, cout: int) -> int:
    """One gather-GEMM-scatter pass: every pair is a (1 x Cin) @ (Cin x Cout) product."""
    return 2 * int(pairs) * int(cin) * int(cout)


def layer_flops(layer: ConvLayer, pass_name: str) -> int:
    """``forward``: out = Σ x W. ``backward``: dW = Σ xᵀ dY, plus dX = Σ dY Wᵀ when the input needs a gradient."""
    fwd = conv_flops(layer.pairs, layer.cin, layer.cout)
    if pass_name in ("forward", "forward_train"):
        return fwd
    bwd = fwd * (2 if layer.input_grad else 1)
    if pass_name == "backward":
        return bwd
    if pass_name == "forward_backward":
        return fwd + bwd
    raise ValueError(f"unknown pass {pass_name!r}")


def total_flops(layers: List[ConvLayer], pass_name: str) -> int:
    return sum(layer_flops(layer, pass_name) for layer in layers)


def gflops_per_s(flops: int, ms: float) -> float:
    return flops / (ms * 1e6) if ms > 0 else float("nan")


def weighted_ratio(rows: Iterable[Dict[str, object]], key: str) -> float:
    """A per-layer ratio (``rows[i][key]``) over a network, weighted by each layer's useful multiply-adds
    (pairs x cin x cout); rows without the key are left out."""
    num = den = 0.0
    for r in rows:
        if r.get(key) is not None:
            w = float(r["pairs"]) * float(r["cin"]) * float(r["cout"])
            num += w * float(r[key])
            den += w
    return num / den if den else float("nan")
