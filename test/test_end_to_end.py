"""End to end on CPU: a SECOND-style VoxelBackBone8x detector backbone and a U-Net segmenter with
SparseInverseConv, trained a few steps on a synthetic LiDAR-like scene; the loss must fall."""
import torch
from torch import nn

import spconv.pytorch as spconv


def _block(cin, cout, kernel, indice_key, stride=1, padding=0, conv_type="subm"):
    if conv_type == "subm":
        conv = spconv.SubMConv3d(cin, cout, kernel, bias=False, indice_key=indice_key)
    elif conv_type == "spconv":
        conv = spconv.SparseConv3d(cin, cout, kernel, stride=stride, padding=padding, bias=False,
                                   indice_key=indice_key)
    else:
        conv = spconv.SparseInverseConv3d(cin, cout, kernel, indice_key=indice_key, bias=False)
    return spconv.SparseSequential(conv, nn.BatchNorm1d(cout, eps=1e-3, momentum=0.01), nn.ReLU())


class VoxelBackBone8x(nn.Module):
    """OpenPCDet's VoxelBackBone8x layout (SubM + stride-2 SparseConv stages, same indice_keys), narrower."""

    def __init__(self, cin, c=(8, 16, 24, 32, 48)):
        super().__init__()
        self.conv_input = _block(cin, c[0], 3, "subm1")
        self.conv1 = spconv.SparseSequential(_block(c[0], c[0], 3, "subm1"))
        self.conv2 = spconv.SparseSequential(_block(c[0], c[1], 3, "spconv2", 2, 1, "spconv"),
                                             _block(c[1], c[1], 3, "subm2"), _block(c[1], c[1], 3, "subm2"))
        self.conv3 = spconv.SparseSequential(_block(c[1], c[2], 3, "spconv3", 2, 1, "spconv"),
                                             _block(c[2], c[2], 3, "subm3"), _block(c[2], c[2], 3, "subm3"))
        self.conv4 = spconv.SparseSequential(_block(c[2], c[3], 3, "spconv4", 2, (0, 1, 1), "spconv"),
                                             _block(c[3], c[3], 3, "subm4"), _block(c[3], c[3], 3, "subm4"))
        self.conv_out = _block(c[3], c[4], (3, 1, 1), "spconv_down2", (2, 1, 1), 0, "spconv")

    def forward(self, x):
        x = self.conv_input(x)
        for layer in (self.conv1, self.conv2, self.conv3, self.conv4, self.conv_out):
            x = layer(x)
        dense = x.dense()  # [B, C, D, H, W] -> BEV [B, C * D, H, W] (OpenPCDet's HeightCompression)
        b, c, d, h, w = dense.shape
        return dense.view(b, c * d, h, w)


class UNet(nn.Module):
    """SubM encoder, stride-2 SparseConv and max-pool downsampling, SparseInverseConv decoder with skips."""

    def __init__(self, cin, ncls, c=8):
        super().__init__()
        self.stem = _block(cin, c, 3, "s0")
        self.down1 = _block(c, 2 * c, 3, "down1", 2, 1, "spconv")
        self.enc1 = _block(2 * c, 2 * c, 3, "s1")
        self.pool = spconv.SparseMaxPool3d(2, 2, indice_key="pool2")
        self.enc2 = _block(2 * c, 2 * c, 3, "s2")
        self.unpool = _block(2 * c, 2 * c, 2, "pool2", conv_type="inverse")
        self.join = spconv.JoinTable()
        self.up1 = _block(4 * c, c, 3, "down1", conv_type="inverse")
        self.add = spconv.AddTable()
        self.head = spconv.SubMConv3d(c, ncls, 1, indice_key="s0")

    def forward(self, x):
        x0 = self.stem(x)
        x1 = self.enc1(self.down1(x0))
        x2 = self.enc2(self.pool(x1))
        u1 = self.join([self.unpool(x2), x1])  # the inverse conv restores x1's rows in x1's order
        u0 = self.add([self.up1(u1), x0])
        return self.head(u0).features


def _scene(seed, batch_size=2, shape=(41, 32, 32), n_objects=6):
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


def _train(model, head, loss_fn, x, target, steps=8, lr=1e-2):
    torch.manual_seed(0)
    params = list(model.parameters()) + list(head.parameters())
    opt = torch.optim.Adam(params, lr=lr)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = loss_fn(head(model(x)), target)
        loss.backward()
        assert all(p.grad is None or torch.isfinite(p.grad).all() for p in params)
        opt.step()
        losses.append(loss.item())
    return losses


def test_voxel_backbone8x_trains():
    torch.manual_seed(0)
    x, _, heat = _scene(0)
    backbone = VoxelBackBone8x(4)
    # spatial [41, 32, 32] -> conv_out [2, 4, 4]: BEV channels 48 * 2.
    head = nn.Conv2d(96, 1, 1)
    with torch.no_grad():
        assert backbone(x).shape == (2, 96, 4, 4)
    losses = _train(backbone, head, nn.BCEWithLogitsLoss(), x, heat)
    assert losses[-1] < 0.8 * losses[0], losses


def test_unet_with_inverse_conv_trains():
    torch.manual_seed(0)
    x, cls, _ = _scene(1)
    model = UNet(4, 2)
    with torch.no_grad():
        assert model(x).shape == (x.indices.shape[0], 2)
    losses = _train(model, nn.Identity(), nn.CrossEntropyLoss(), x, cls)
    assert losses[-1] < 0.8 * losses[0], losses
