"""The ``basic`` network (spconv's bench_basic): 14 SubMConv3d 3x3x3, pairs sharing an ``indice_key``, a
SparseMaxPool3d(2, 2) after each pair but the last, no bias, batch 1.

Standalone on purpose (imports nothing from this project): the compare worker loads this file in another
environment and builds the same network from *that* environment's ``spconv.pytorch``.
"""
from typing import List, Tuple

BASIC_CHANNELS: Tuple[int, ...] = (64, 64, 96, 96, 128, 128, 160, 160, 192, 192, 224, 224, 256, 256)


def basic_layer_specs(in_channels: int = 3) -> List[Tuple[str, int, int, str]]:
    """[(kind, cin, cout, indice_key)] in order; kind is "subm" or "pool" (pool rows carry cin = cout)."""
    specs = []
    cin = in_channels
    for i, cout in enumerate(BASIC_CHANNELS):
        key = f"subm{i // 2}"
        specs.append(("subm", cin, cout, key))
        cin = cout
        if i % 2 == 1 and i != len(BASIC_CHANNELS) - 1:
            specs.append(("pool", cout, cout, ""))
    return specs


def build_basic_net(sp, in_channels: int = 3):
    """The network from the ``spconv.pytorch`` module ``sp`` (ours or another implementation's)."""
    layers = []
    for kind, cin, cout, key in basic_layer_specs(in_channels):
        if kind == "subm":
            layers.append(sp.SubMConv3d(cin, cout, 3, bias=False, indice_key=key))
        else:
            layers.append(sp.SparseMaxPool3d(2, 2))
    return sp.SparseSequential(*layers)
