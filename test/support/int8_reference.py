"""Plain integer reference of the quantized_conv op (csrc/ops/schema.cpp, int8 section): exact int64 sums over
the neighbour table, then the FP32 epilogue with each operation rounded on its own, as the kernels do it."""
from typing import Optional

import torch


def int8_conv_reference(features: torch.Tensor, filters: torch.Tensor, nbr: torch.Tensor, scale: torch.Tensor,
                        bias: Optional[torch.Tensor], residual: Optional[torch.Tensor], residual_scale: float,
                        activation: int, alpha: float) -> torch.Tensor:
    """features int8 [N, Cin], filters int8 [kvol, Cin, Cout], nbr int32 [num_out, T] -> int8 [num_out, Cout]."""
    kvol, cin, cout = filters.shape
    num_out, t = nbr.shape
    x = features.to(torch.int64)
    w = filters.to(torch.int64)
    acc = torch.zeros(num_out, cout, dtype=torch.int64)
    for j in range(t):
        rows = nbr[:, j].to(torch.int64)
        hit = rows >= 0
        if bool(hit.any()):
            acc[hit] += x[rows[hit]] @ w[j % kvol]
    assert int(acc.abs().max()) < 2 ** 31 if acc.numel() else True
    v = acc.to(torch.int32).to(torch.float32) * scale.to(torch.float32)
    if bias is not None:
        v = v + bias.to(torch.float32)
    if residual is not None:
        v = v + residual.to(torch.float32) * torch.tensor(residual_scale, dtype=torch.float32)
    if activation == 1:
        v = torch.clamp_min(v, 0.0)
    elif activation == 2:
        v = torch.where(v < 0, v * torch.tensor(alpha, dtype=torch.float32), v)
    return torch.clamp(torch.round(v), -128, 127).to(torch.int8)


def random_table(num_in: int, num_out: int, kvol: int, rounds: int = 1, fill: float = 0.4,
                 generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """A neighbour table with about ``fill`` of its entries present (-1 elsewhere)."""
    g = generator
    rows = torch.randint(0, max(num_in, 1), (num_out, kvol * rounds), generator=g, dtype=torch.int32)
    present = torch.rand(num_out, kvol * rounds, generator=g) < fill
    if num_in == 0:
        present[:] = False
    return torch.where(present, rows, torch.full_like(rows, -1))
