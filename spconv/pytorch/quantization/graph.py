"""Graph passes over a converted model (spconv 2.x: ``quantization.graph``)."""
from typing import Dict, Optional

import torch
import torch.fx
from torch import nn

from spconv.pytorch.quantization.core import quantize_per_tensor, quantized_add


def is_dequantize_node(node) -> bool:
    return isinstance(node, torch.fx.Node) and node.op == "call_method" and node.target == "dequantize"


def _get_module(node: torch.fx.Node, modules: Dict[str, nn.Module]) -> Optional[nn.Module]:
    if node.op == "call_module":
        return modules.get(str(node.target))
    return None


def _finish(m: torch.fx.GraphModule) -> torch.fx.GraphModule:
    m.graph.eliminate_dead_code()
    m.recompile()
    m.graph.lint()
    return m


def remove_conv_add_dq(model: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The fused int8 conv-add-relu reads its residual quantized: drop the dequantize convert_fx put before it."""
    from spconv.pytorch.quantization.intrinsic.quantized import SparseConvAddReLU
    modules = dict(model.named_modules(remove_duplicate=False))
    for n in model.graph.nodes:
        if isinstance(_get_module(n, modules), SparseConvAddReLU) and len(n.args) > 1:
            residual = n.args[1]
            if is_dequantize_node(residual):
                n.replace_input_with(residual, residual.args[0])
    return _finish(model)


def transform_qdq(m: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``torch.quantize_per_tensor`` and ``torch.ops.quantized.add`` don't take SparseConvTensors: use this
    package's versions in the graph."""
    for node in m.graph.nodes:
        if node.op == "call_function":
            if node.target == torch.quantize_per_tensor:
                node.target = quantize_per_tensor
            elif node.target == torch.ops.quantized.add:
                node.target = quantized_add
    return _finish(m)
