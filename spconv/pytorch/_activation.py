"""Fused activations of the sparse convs (spconv 2.x's ``act_type``): the name check and the function. Ground
floor: used by the modules and by spconv 2.x's ops functions."""
import torch
import torch.nn.functional as F


def _activation_name(act_type) -> str:
    """Accepts spconv.core.Activation, cumm's tv.gemm.Activation or a string."""
    name = act_type if isinstance(act_type, str) else getattr(act_type, "name", str(act_type))
    name = name.split(".")[-1]
    if name in ("None_", "None", "none", "Identity"):
        return "None_"
    if name not in ("ReLU", "Sigmoid", "LeakyReLU"):
        raise ValueError(f"act_type must be one of None_, ReLU, Sigmoid, LeakyReLU, got {act_type!r}")
    return name


def apply_activation(x: torch.Tensor, act: str, alpha: float) -> torch.Tensor:
    if act == "ReLU":
        return F.relu(x)
    if act == "Sigmoid":
        return torch.sigmoid(x)
    if act == "LeakyReLU":
        return F.leaky_relu(x, alpha)
    return x
