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


def build_backbone8x(sp, nn, in_channels: int = 3):
    """OpenPCDet's VoxelBackBone8x (channels 16-32-64-64, 128 out, each conv followed by BatchNorm1d(eps=1e-3,
    momentum=0.01) and ReLU) from the ``spconv.pytorch`` module ``sp`` and ``torch.nn``, as one SparseSequential
    ending before HeightCompression (the caller takes ``.dense()``). deploy_models.VoxelBackBone8x is the same
    network with the dense BEV map inside."""
    def block(cin, cout, key, stride=1, padding=1, kernel=3, subm=True):
        conv = (sp.SubMConv3d(cin, cout, kernel, padding=padding, bias=False, indice_key=key) if subm else
                sp.SparseConv3d(cin, cout, kernel, stride=stride, padding=padding, bias=False, indice_key=key))
        return [conv, nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU()]

    mods = block(in_channels, 16, "subm1") + block(16, 16, "subm1")
    for cin, cout, i, pad in ((16, 32, 2, 1), (32, 64, 3, 1), (64, 64, 4, (0, 1, 1))):
        mods += block(cin, cout, f"spconv{i}", 2, pad, subm=False)
        mods += block(cout, cout, f"subm{i}") + block(cout, cout, f"subm{i}")
    mods += block(64, 128, "spconv_down2", (2, 1, 1), 0, (3, 1, 1), subm=False)
    return sp.SparseSequential(*mods)
