"""Small test networks and scenes: U-Net and its block, a mixed-layer stack, a LiDAR-like scene, a trained int8 net."""
import torch
from torch import nn

import spconv.pytorch as spconv


def conv_bn_relu(cin, cout, kernel, indice_key, stride=1, padding=0, conv_type="subm"):
    """A conv of the kind conv_type (subm, spconv, inverse; no bias), BatchNorm1d and ReLU."""
    if conv_type == "subm":
        conv = spconv.SubMConv3d(cin, cout, kernel, bias=False, indice_key=indice_key)
    elif conv_type == "spconv":
        conv = spconv.SparseConv3d(cin, cout, kernel, stride=stride, padding=padding, bias=False,
                                   indice_key=indice_key)
    else:
        conv = spconv.SparseInverseConv3d(cin, cout, kernel, indice_key=indice_key, bias=False)
    return spconv.SparseSequential(conv, nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())


class UNet(nn.Module):
    """SubM encoder, stride-2 SparseConv and max-pool downsampling, SparseInverseConv decoder with skips."""

    def __init__(self, cin, ncls, c=8):
        super().__init__()
        self.stem = conv_bn_relu(cin, c, 3, "s0")
        self.down1 = conv_bn_relu(c, 2 * c, 3, "down1", 2, 1, "spconv")
        self.enc1 = conv_bn_relu(2 * c, 2 * c, 3, "s1")
        self.pool = spconv.SparseMaxPool3d(2, 2, indice_key="pool2")
        self.enc2 = conv_bn_relu(2 * c, 2 * c, 3, "s2")
        self.unpool = conv_bn_relu(2 * c, 2 * c, 2, "pool2", conv_type="inverse")
        self.join = spconv.JoinTable()
        self.up1 = conv_bn_relu(4 * c, c, 3, "down1", conv_type="inverse")
        self.add = spconv.AddTable()
        self.head = spconv.SubMConv3d(c, ncls, 1, indice_key="s0")

    def forward(self, x):
        x0 = self.stem(x)
        x1 = self.enc1(self.down1(x0))
        x2 = self.enc2(self.pool(x1))
        u1 = self.join([self.unpool(x2), x1])  # the inverse conv restores x1's rows in x1's order
        u0 = self.add([self.up1(u1), x0])
        return self.head(u0).features


def lidar_scene(seed, batch_size=2, shape=(41, 32, 32), n_objects=6):
    """Ground plane plus box-shaped objects; per-voxel class (0 ground, 1 object) and a BEV object heatmap."""
    g = torch.Generator().manual_seed(seed)
    d, h, w = shape
    idx, cls = [], []
    heat = torch.zeros(batch_size, 1, h // 8, w // 8)
    for b in range(batch_size):
        ground = torch.randperm(h * w, generator=g)[: h * w // 3]
        for flat in ground.tolist():
            idx.append((b, 1, flat // w, flat % w))
            cls.append(0)
        for _ in range(n_objects):
            y0, x0 = torch.randint(0, h - 4, (2,), generator=g).tolist()
            height = int(torch.randint(4, 12, (1,), generator=g))
            for z in range(2, 2 + height):
                for y in range(y0, y0 + 4):
                    for x in range(x0, x0 + 4):
                        if torch.rand(1, generator=g) < 0.5:
                            idx.append((b, z, y, x))
                            cls.append(1)
            heat[b, 0, (y0 + 2) // 8, (x0 + 2) // 8] = 1.0
    idx_t = torch.tensor(idx, dtype=torch.int32)
    keys = ((idx_t[:, 0].long() * d + idx_t[:, 1]) * h + idx_t[:, 2]) * w + idx_t[:, 3]
    _, first = torch.unique(keys, return_inverse=True)
    keep = torch.zeros(keys.numel(), dtype=torch.bool)
    seen = set()
    for i, k in enumerate(first.tolist()):
        if k not in seen:
            seen.add(k)
            keep[i] = True
    idx_t, cls_t = idx_t[keep], torch.tensor(cls)[keep]
    feats = torch.cat([idx_t[:, 1:].float() / torch.tensor(shape, dtype=torch.float32),
                       torch.rand(idx_t.shape[0], 1, generator=g)], 1)
    return spconv.SparseConvTensor(feats, idx_t, list(shape), batch_size), cls_t, heat


def mixed_layers_net(c_in, c, batch_norm=False):
    """SubM, strided, max-pool, inverse and transposed convs in one SparseSequential (c_in -> c -> c_in), with
    BatchNorm1d after the first conv when batch_norm."""
    # torch's own training-mode BatchNorm1d on the CPU reduces in a thread-count-dependent order, so it only
    # takes part in the run-to-run comparison.
    return spconv.SparseSequential(
        spconv.SubMConv3d(c_in, c, 3, indice_key="s0"), nn.BatchNorm1d(c) if batch_norm else nn.Identity(),
        nn.ReLU(),
        spconv.SparseConv3d(c, c, 3, 2, 1, indice_key="down"),
        spconv.SubMConv3d(c, c, 3, indice_key="s1"), spconv.SubMConv3d(c, c, 1),
        spconv.SparseMaxPool3d(2, 2, indice_key="pool"), spconv.SparseInverseConv3d(c, c, 2, indice_key="pool"),
        spconv.SparseInverseConv3d(c, c, 3, indice_key="down"),
        spconv.SparseConvTranspose3d(c, c_in, 3, 1, 1))


def trained_residual_net(block, seed: int, n_batches: int, steps: int):
    """spconv's int8 example network after a few optimizer steps on image batches: (net, batches)."""
    # imported here: the quantization models pull in torch.fx, which the other networks' users need not load
    from spconv.benchmark.quant_models import ResidualNet, image_batch, train_a_little

    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(seed)
    net = ResidualNet(block)
    batches = [image_batch(g) for _ in range(n_batches)]
    train_a_little(net, batches, steps=steps)
    return net, batches
