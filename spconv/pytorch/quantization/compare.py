"""Per-layer accuracy of a converted int8 model against its prepared float model (same inputs): the relative L2
error of every int8 sparse conv's output, dequantized, against the float output of the layer it replaced."""
from typing import Dict

import torch

from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization.quantized.conv import _SparseConv


def _features(x) -> torch.Tensor:
    t = x.features if isinstance(x, SparseConvTensor) else x
    return (t.dequantize() if t.is_quantized else t).float()


def _capture(model: torch.nn.Module, names, store: Dict[str, torch.Tensor]):
    modules = dict(model.named_modules())
    hooks = []
    for name in names:
        def hook(mod, args, out, name=name):
            store[name] = _features(out)
        hooks.append(modules[name].register_forward_hook(hook))
    return hooks


@torch.no_grad()
def layer_errors(prepared: torch.nn.Module, converted: torch.nn.Module, *inputs) -> Dict[str, float]:
    """{layer name: ||int8 - float|| / ||float||} for every int8 sparse conv of ``converted``, in graph order."""
    names = [n for n, m in converted.named_modules() if isinstance(m, _SparseConv)]
    ref: Dict[str, torch.Tensor] = {}
    got: Dict[str, torch.Tensor] = {}
    hooks = _capture(prepared, names, ref) + _capture(converted, names, got)
    try:
        prepared(*inputs)
        converted(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return {n: float((got[n] - ref[n]).norm() / ref[n].norm().clamp_min(1e-30)) for n in names if n in got}
