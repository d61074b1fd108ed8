"""Dense references: the same computation with F.conv3d / F.max_pool3d on a small cropped window.

A sparse network on a crop equals a dense network on that crop's dense grid if SubM outputs are masked to
the active sites and max-pooling only sees active sites; so a fast wrong answer anywhere in the route shows up.
"""
import torch
import torch.nn.functional as F

# max |sparse - reference| / max |reference| allowed, by the dtype the sparse side ran in.
TOLERANCE = {torch.float32: 1e-4, torch.float64: 1e-9, torch.float16: 1e-2, torch.bfloat16: 5e-2}
TF32_TOLERANCE = 5e-3


def rel_error(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double().cpu(), ref.double().cpu()
    if got.shape != ref.shape:
        return float("nan")
    scale = ref.abs().max().item() if ref.numel() else 0.0
    diff = (got - ref).abs().max().item() if ref.numel() else 0.0
    return diff / scale if scale > 0 else diff


def dense_weight(weight: torch.Tensor) -> torch.Tensor:
    """spconv's [Cout, kz, ky, kx, Cin] -> F.conv3d's [Cout, Cin, kz, ky, kx]."""
    return weight.permute(0, 4, 1, 2, 3)


def dense_subm(x: torch.Tensor, mask: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Submanifold conv (odd kernel, stride 1): a same-padded dense conv read at the active sites only."""
    pad = [k // 2 for k in weight.shape[1:4]]
    return F.conv3d(x, dense_weight(weight), padding=pad) * mask


def dense_conv(x: torch.Tensor, weight: torch.Tensor, stride: int, padding: int) -> torch.Tensor:
    """Regular sparse conv: output sites are those whose window holds an active input; elsewhere the dense
    result is exactly zero (no bias), so no mask is needed."""
    return F.conv3d(x, dense_weight(weight), stride=stride, padding=padding)


def dense_maxpool(x: torch.Tensor, mask: torch.Tensor, k: int, s: int):
    """Sparse max-pool (spconv semantics): an output is active if any input in its window is, and its value is
    max(0, max over the active inputs) -- the dense max-pool of the zero-filled tensor, clamped at 0."""
    y = F.max_pool3d(x * mask, k, s).clamp(min=0)  # inactive sites count as 0
    out_mask = F.max_pool3d(mask.to(x.dtype), k, s) > 0
    return y * out_mask, out_mask


def to_dense(features: torch.Tensor, indices: torch.Tensor, shape):
    """(x [1, C, *shape], active mask [1, 1, *shape]) for a batch-1 sparse tensor."""
    x = torch.zeros(1, features.shape[1], *shape, dtype=features.dtype)
    mask = torch.zeros(1, 1, *shape, dtype=torch.bool)
    z, y, w = indices[:, 1].long(), indices[:, 2].long(), indices[:, 3].long()
    x[0, :, z, y, w] = features.t()
    mask[0, 0, z, y, w] = True
    return x, mask


def dense_sequential(specs, weights, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Runs ``basic_layer_specs`` rows with the given SubM weights (in order) densely."""
    it = iter(weights)
    for kind, _, _, _ in specs:
        if kind == "subm":
            x = dense_subm(x, mask, next(it))
        else:
            x, mask = dense_maxpool(x, mask, 2, 2)
    return x


def dense_sparse_sequential(modules, x: torch.Tensor, mask: torch.Tensor):
    """The modules of a sparse network (SubMConv3d, SparseConv3d without bias, eval-mode BatchNorm1d, ReLU, in
    order) densely: (x, active mask) after them. A strided conv's outputs are the sites whose window holds an
    active input; BatchNorm and ReLU act on the active sites only."""
    import spconv.pytorch as sp
    for m in modules:
        if isinstance(m, sp.SubMConv3d):
            x = dense_subm(x, mask, m.weight)
        elif isinstance(m, sp.SparseConv3d):
            x = dense_conv(x, m.weight, m.stride, m.padding)
            window = torch.ones(1, 1, *m.kernel_size, dtype=x.dtype)
            mask = F.conv3d(mask.to(x.dtype), window, stride=m.stride, padding=m.padding) > 0
        elif isinstance(m, torch.nn.BatchNorm1d):
            shape = (1, -1, 1, 1, 1)
            scale = (m.weight / torch.sqrt(m.running_var + m.eps)).view(shape)
            x = ((x - m.running_mean.view(shape)) * scale + m.bias.view(shape)) * mask
        elif isinstance(m, torch.nn.ReLU):
            x = x.clamp(min=0)
        else:
            raise TypeError(f"no dense reference for {type(m).__name__}")
    return x, mask
