"""Feature computation of sparse layers: the route choice and autograd wiring (spconv 2.x: ``functional``)."""
import torch

from spconv import _backend
from spconv.pytorch import ops
from spconv.pytorch.core import PairMaps


def weight_to_filters(weight: torch.Tensor) -> torch.Tensor:
    """spconv 2.x weight ``[Cout, *kernel, Cin]`` -> per-offset GEMM operands ``[kvol, Cin, Cout]``."""
    cout, cin = weight.shape[0], weight.shape[-1]
    return weight.reshape(cout, -1, cin).permute(1, 2, 0).contiguous()


def conv_features(features: torch.Tensor, filters: torch.Tensor, maps: PairMaps, num_out: int) -> torch.Tensor:
    """Runs one sparse convolution on the route the dispatcher picks; differentiable in features and filters."""
    maps = maps.to(features.device)
    if _backend.fused_route_enabled(features.device):
        from spconv.pytorch import _fused
        out = _fused.fused_conv(features, filters, maps, num_out)
        if out is not None:
            return out
    return ops.indice_conv_native(features, filters, maps, num_out)
