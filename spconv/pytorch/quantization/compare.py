"""Per-layer accuracy of a converted int8 model against its prepared float model (same inputs), three ways:

* ``layer_errors``: the relative L2 error of every int8 sparse conv's output, dequantized, against the float
  output of the layer it replaced, with the int8 model run end to end (errors of earlier layers included);
* ``isolated_layer_errors``: the same with each int8 layer fed the float layer's own input, quantized at the
  int8 layer's input scale (what that layer alone adds: its input, weight and output rounding);
* ``quantization_floors``: the error of rounding the float output to int8 at the best single symmetric scale
  (searched on these inputs): no per-tensor int8 output can do better, whatever the calibration or kernel.
"""
from typing import Dict, List, Tuple

import torch

from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization.core import quantize_per_tensor
from spconv.pytorch.quantization.quantized.conv import _SparseConv


def _features(x) -> torch.Tensor:
    t = x.features if isinstance(x, SparseConvTensor) else x
    return (t.dequantize() if t.is_quantized else t).float()


def _relative(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def _int8_layers(converted: torch.nn.Module) -> List[str]:
    return [n for n, m in converted.named_modules() if isinstance(m, _SparseConv)]


@torch.no_grad()
def _record(prepared, converted, inputs, run_int8: bool = True) -> Tuple[List[str], Dict[str, tuple],
                                                                         Dict[str, tuple]]:
    """Runs the models once (the int8 one only with ``run_int8``); per int8 layer name: (float inputs, float
    output) and (int8 inputs, int8 output)."""
    names = _int8_layers(converted)
    ref: Dict[str, tuple] = {}
    got: Dict[str, tuple] = {}
    runs = [(prepared, ref)] + ([(converted, got)] if run_int8 else [])
    hooks = []
    for model, store in runs:
        modules = dict(model.named_modules())
        for name in names:
            def hook(mod, args, out, name=name, store=store):
                store[name] = (args, out)
            hooks.append(modules[name].register_forward_hook(hook))
    try:
        for model, _ in runs:
            model(*inputs)
    finally:
        for h in hooks:
            h.remove()
    return [n for n in names if n in ref and (n in got or not run_int8)], ref, got


def layer_errors(prepared: torch.nn.Module, converted: torch.nn.Module, *inputs) -> Dict[str, float]:
    """{layer name: ||int8 - float|| / ||float||} for every int8 sparse conv of ``converted``, in graph order,
    the int8 model run end to end."""
    names, ref, got = _record(prepared, converted, inputs)
    return {n: _relative(_features(got[n][1]), _features(ref[n][1])) for n in names}


@torch.no_grad()
def isolated_layer_errors(prepared: torch.nn.Module, converted: torch.nn.Module, *inputs) -> Dict[str, float]:
    """{layer name: relative error} of each int8 sparse conv run on its float layer's inputs (quantized at the
    scales its int8 inputs had): the error the layer adds by itself."""
    names, ref, got = _record(prepared, converted, inputs)
    modules = dict(converted.named_modules())
    out = {}
    for n in names:
        float_args, int8_args = ref[n][0], got[n][0]
        args = [quantize_per_tensor(f, q.q_scale(), 0, torch.qint8) if isinstance(q, SparseConvTensor) else f
                for f, q in zip(float_args, int8_args)]
        out[n] = _relative(_features(modules[n](*args)), _features(ref[n][1]))
    return out


def best_int8_error(x: torch.Tensor, steps: int = 200) -> float:
    """The least relative L2 error of symmetric per-tensor int8 rounding of ``x`` over ``steps`` clipping
    ranges between max|x| / steps and max|x|."""
    x = x.float().flatten()
    top = float(x.abs().max()) if x.numel() else 0.0
    if top == 0.0:
        return 0.0
    norm = x.norm()
    best = float("inf")
    for i in range(1, steps + 1):
        scale = top * i / steps / 127
        err = float((torch.clamp(torch.round(x / scale), -128, 127) * scale - x).norm() / norm)
        best = min(best, err)
    return best


def quantization_floors(prepared: torch.nn.Module, converted: torch.nn.Module, *inputs) -> Dict[str, float]:
    """{layer name: the least error any per-tensor symmetric int8 output of that layer can have}."""
    names, ref, _ = _record(prepared, converted, inputs, run_int8=False)  # the float outputs alone
    return {n: best_int8_error(_features(ref[n][1])) for n in names}
