"""Operands of the CPU int8 kernel tests: call shapes, random quantized_conv operands, float-edge scales and biases."""
import torch

from support.int8_reference import random_table


def int8_operands(cin, cout, kvol, rounds, num_in=150, num_out=130, bias=True, residual=True, seed=0, fill=0.4):
    """(features, filters, nbr, scale, bias, residual) of one quantized_conv call, random from seed."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-128, 128, (num_in, cin), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (kvol, cin, cout), dtype=torch.int8, generator=g)
    nbr = random_table(num_in, num_out, kvol, rounds, fill=fill, generator=g)
    # outputs spread over the int8 range: about one unit per sqrt(products) of the sum's spread
    scale = (torch.rand(cout, generator=g) + 0.5) / (64.0 * max(1.0, (cin * kvol * rounds * fill) ** 0.5) * 40)
    b = torch.randn(cout, generator=g) * 20 if bias else None
    res = torch.randint(-128, 128, (num_out, cout), dtype=torch.int8, generator=g) if residual else None
    return x, w, nbr, scale, b, res


CHANNELS = [1, 3, 4, 16, 17, 32, 64, 96, 128, 256]
# (cin, cout, kvol, rounds): every channel count on both sides, every kernel volume, one and two rounds
SHAPES = [(c, CHANNELS[(i + 3) % len(CHANNELS)], (1, 8, 27)[i % 3], 1 + i % 2) for i, c in enumerate(CHANNELS)]
SHAPES += [(c, c, 27, 1) for c in (16, 64, 128)] + [(5, 80, 27, 2), (256, 256, 8, 2), (64, 1, 27, 1)]


def special_operands():
    """Scales and biases at the float edges: inf, -inf, NaN, huge, denormal (NaN outputs become 0)."""
    x, w, nbr, _, _, res = int8_operands(8, 16, 8, 1, num_in=40, num_out=30, seed=7)
    scale = torch.tensor([float("inf"), -float("inf"), float("nan"), 1e30, 1e-40, 0.0, -0.0, 1e-3] * 2)
    bias = torch.tensor([0.0, 1.0, 2.0, -1e30, float("nan"), float("inf"), 0.5, -0.5] * 2)
    return x, w, nbr, scale, bias, res
