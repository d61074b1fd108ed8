"""End to end on CPU: a SECOND-style VoxelBackBone8x detector backbone and a U-Net segmenter with
SparseInverseConv, trained a few steps on a synthetic LiDAR-like scene; the loss must fall."""
import torch
from torch import nn

import spconv.pytorch as spconv
from support.nets import UNet, conv_bn_relu, lidar_scene


class VoxelBackBone8x(nn.Module):
    """OpenPCDet's VoxelBackBone8x layout (SubM + stride-2 SparseConv stages, same indice_keys), narrower."""

    def __init__(self, cin, c=(8, 16, 24, 32, 48)):
        super().__init__()
        self.conv_input = conv_bn_relu(cin, c[0], 3, "subm1")
        self.conv1 = spconv.SparseSequential(conv_bn_relu(c[0], c[0], 3, "subm1"))
        self.conv2 = spconv.SparseSequential(conv_bn_relu(c[0], c[1], 3, "spconv2", 2, 1, "spconv"),
                                             conv_bn_relu(c[1], c[1], 3, "subm2"), conv_bn_relu(c[1], c[1], 3, "subm2"))
        self.conv3 = spconv.SparseSequential(conv_bn_relu(c[1], c[2], 3, "spconv3", 2, 1, "spconv"),
                                             conv_bn_relu(c[2], c[2], 3, "subm3"), conv_bn_relu(c[2], c[2], 3, "subm3"))
        self.conv4 = spconv.SparseSequential(conv_bn_relu(c[2], c[3], 3, "spconv4", 2, (0, 1, 1), "spconv"),
                                             conv_bn_relu(c[3], c[3], 3, "subm4"), conv_bn_relu(c[3], c[3], 3, "subm4"))
        self.conv_out = conv_bn_relu(c[3], c[4], (3, 1, 1), "spconv_down2", (2, 1, 1), 0, "spconv")

    def forward(self, x):
        x = self.conv_input(x)
        for layer in (self.conv1, self.conv2, self.conv3, self.conv4, self.conv_out):
            x = layer(x)
        dense = x.dense()  # [B, C, D, H, W] -> BEV [B, C * D, H, W] (OpenPCDet's HeightCompression)
        b, c, d, h, w = dense.shape
        return dense.view(b, c * d, h, w)


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
    x, _, heat = lidar_scene(0)
    backbone = VoxelBackBone8x(4)
    # spatial [41, 32, 32] -> conv_out [2, 4, 4]: BEV channels 48 * 2.
    head = nn.Conv2d(96, 1, 1)
    with torch.no_grad():
        assert backbone(x).shape == (2, 96, 4, 4)
    losses = _train(backbone, head, nn.BCEWithLogitsLoss(), x, heat)
    assert losses[-1] < 0.8 * losses[0], losses


def test_unet_with_inverse_conv_trains():
    torch.manual_seed(0)
    x, cls, _ = lidar_scene(1)
    model = UNet(4, 2)
    with torch.no_grad():
        assert model(x).shape == (x.indices.shape[0], 2)
    losses = _train(model, nn.Identity(), nn.CrossEntropyLoss(), x, cls)
    assert losses[-1] < 0.8 * losses[0], losses
