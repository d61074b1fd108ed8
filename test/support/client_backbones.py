"""The sparse backbones of OpenPCDet, mmdetection3d, Pointcept and CenterPoint, rebuilt at test sizes (few channels,
small grids) with the same layer kinds, indice keys, tensor plumbing and spconv calls as the clients' modules.

This project's own code, standalone (torch, numpy and ``sp`` passed in) like client_nets.py, so that the same
definitions run on this package and, through reference_worker.py, on the real spconv 2.3.8. Each class names its
input (``INPUT``: grid, channels, sites per batch entry) and returns a dict of outputs (sparse tensors or dense).
"""
from collections import OrderedDict

import numpy as np
import torch
from torch import nn


def _bn(c):
    return nn.BatchNorm1d(c, eps=1e-3, momentum=0.01)


def _block(sp, cin, cout, k, key, kind="subm", stride=1, padding=0, dim=3, inplace=False):
    """conv -> BatchNorm1d -> ReLU (OpenPCDet's post_act_block, mmdetection3d's make_sparse_convmodule)."""
    if kind == "subm":
        conv = getattr(sp, f"SubMConv{dim}d")(cin, cout, k, bias=False, indice_key=key, padding=padding)
    elif kind == "spconv":
        conv = getattr(sp, f"SparseConv{dim}d")(cin, cout, k, stride=stride, padding=padding, bias=False,
                                                indice_key=key)
    else:
        conv = getattr(sp, f"SparseInverseConv{dim}d")(cin, cout, k, indice_key=key, bias=False)
    return sp.SparseSequential(conv, _bn(cout), nn.ReLU(inplace=inplace))


def _res_block_class(sp):
    class SparseBasicBlock(sp.SparseModule):
        """Two SubM convs with norms, the identity added back through replace_feature (OpenPCDet, CenterPoint)."""

        def __init__(self, c, key, dim=3):
            super().__init__()
            conv = getattr(sp, f"SubMConv{dim}d")
            self.conv1 = conv(c, c, 3, stride=1, padding=1, bias=True, indice_key=key)
            self.bn1 = _bn(c)
            self.relu = nn.ReLU()
            self.conv2 = conv(c, c, 3, stride=1, padding=1, bias=True, indice_key=key)
            self.bn2 = _bn(c)

        def forward(self, x):
            identity = x
            out = self.conv1(x)
            out = out.replace_feature(self.bn1(out.features))
            out = out.replace_feature(self.relu(out.features))
            out = self.conv2(out)
            out = out.replace_feature(self.bn2(out.features))
            out = out.replace_feature(out.features + identity.features)
            return out.replace_feature(self.relu(out.features))
    return SparseBasicBlock


def _bev(out):
    """HeightCompression / SparseEncoder: dense() [N, C, D, H, W] viewed as [N, C*D, H, W]."""
    dense = out.dense()
    n, c, d, h, w = dense.shape
    return dense.view(n, c * d, h, w)


def _downsample_centres(x, key):
    """A head reading a stride-2 layer's kernel map from ``indice_dict``: the mean input coordinate that reaches
    each output site, through ``indice_pairs`` / ``indice_pair_num`` (order-free, so comparable across builds)."""
    data = x.indice_dict[key]
    pairs, counts = data.indice_pairs.long(), data.indice_pair_num.tolist()
    coords = data.indices[:, 1:].to(torch.float64)
    total = coords.new_zeros((data.out_indices.shape[0], coords.shape[1]))
    hits = coords.new_zeros((data.out_indices.shape[0], 1))
    for k, n in enumerate(counts):
        src, dst = pairs[0, k, :n], pairs[1, k, :n]
        total.index_add_(0, dst, coords[src])
        hits.index_add_(0, dst, torch.ones_like(coords[src, :1]))
    return data.out_indices, total / hits


class PcdetVoxelBackBone8x(nn.Module):
    """OpenPCDet VoxelBackBone8x: SubM stem, four stages (the last with (0,1,1) padding), a (3,1,1) z-squeeze,
    HeightCompression's dense view, and a head reading the stage-2 kernel map from indice_dict."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 4, 3, padding=1, bias=False, indice_key="subm1"),
                                              _bn(4), nn.ReLU())
        self.conv1 = sp.SparseSequential(_block(sp, 4, 4, 3, "subm1", padding=1))
        self.conv2 = sp.SparseSequential(_block(sp, 4, 8, 3, "spconv2", "spconv", 2, 1),
                                         _block(sp, 8, 8, 3, "subm2", padding=1),
                                         _block(sp, 8, 8, 3, "subm2", padding=1))
        self.conv3 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv3", "spconv", 2, 1),
                                         _block(sp, 8, 8, 3, "subm3", padding=1))
        self.conv4 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv4", "spconv", 2, (0, 1, 1)),
                                         _block(sp, 8, 8, 3, "subm4", padding=1))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(8, 16, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(16), nn.ReLU())

    def forward(self, x):
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv2 = self.conv2(x_conv1)
        x_conv4 = self.conv4(self.conv3(x_conv2))
        out = self.conv_out(x_conv4)
        sites, centres = _downsample_centres(x_conv2, "spconv2")
        # the map's out_indices are the stage's indices
        centre = x_conv2.replace_feature(centres.to(x_conv2.features.dtype))
        assert centre.indices is sites or torch.equal(centre.indices, sites)
        return {"x_conv4": x_conv4, "bev": _bev(out), "spconv2_centres": centre}


class PcdetVoxelResBackBone8x(nn.Module):
    """OpenPCDet VoxelResBackBone8x: SparseBasicBlocks (residual via replace_feature) between the stride-2 stages."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        res = _res_block_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 6, 3, padding=1, bias=False, indice_key="subm1"),
                                              _bn(6), nn.ReLU())
        self.conv1 = sp.SparseSequential(res(6, "res1"), res(6, "res1"))
        self.conv2 = sp.SparseSequential(_block(sp, 6, 8, 3, "spconv2", "spconv", 2, 1), res(8, "res2"))
        self.conv3 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv3", "spconv", 2, 1), res(8, "res3"))
        self.conv4 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv4", "spconv", 2, (0, 1, 1)), res(8, "res4"))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(8, 8, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(8), nn.ReLU())

    def forward(self, x):
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv3 = self.conv3(self.conv2(x_conv1))
        x_conv4 = self.conv4(x_conv3)
        return {"x_conv1": x_conv1, "x_conv3": x_conv3, "bev": _bev(self.conv_out(x_conv4))}


class PcdetUNetV2(nn.Module):
    """OpenPCDet UNetV2: encoder, BEV output, and the UR decoder (lateral SparseBasicBlock, concat with the bottom,
    merge conv, channel reduction by summing groups of channels, residual add, inverse conv), voxel centres."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        res = _res_block_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 4, 3, padding=1, bias=False, indice_key="subm1"),
                                              _bn(4), nn.ReLU())
        self.conv1 = sp.SparseSequential(_block(sp, 4, 4, 3, "subm1", padding=1))
        self.conv2 = sp.SparseSequential(_block(sp, 4, 8, 3, "spconv2", "spconv", 2, 1),
                                         _block(sp, 8, 8, 3, "subm2", padding=1))
        self.conv3 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv3", "spconv", 2, (0, 1, 1)),
                                         _block(sp, 8, 8, 3, "subm3", padding=1))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(8, 8, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(8), nn.ReLU())
        self.conv_up_t3, self.conv_up_m3 = res(8, "subm3"), _block(sp, 16, 8, 3, "subm3", padding=1)
        self.inv_conv3 = _block(sp, 8, 8, 3, "spconv3", "inverse")
        self.conv_up_t2, self.conv_up_m2 = res(8, "subm2"), _block(sp, 16, 8, 3, "subm2", padding=1)
        self.inv_conv2 = _block(sp, 8, 4, 3, "spconv2", "inverse")
        self.conv_up_t1, self.conv_up_m1 = res(4, "subm1"), _block(sp, 8, 4, 3, "subm1", padding=1)
        self.conv5 = sp.SparseSequential(_block(sp, 4, 4, 3, "subm1", padding=1))

    @staticmethod
    def _reduce(x, out_channels):
        f = x.features
        n, c = f.shape
        return x.replace_feature(f.view(n, out_channels, -1).sum(dim=2))

    def _ur_block(self, lateral, bottom, conv_t, conv_m, conv_inv):
        trans = conv_t(lateral)
        x = trans.replace_feature(torch.cat((bottom.features, trans.features), dim=1))
        merged = conv_m(x)
        x = self._reduce(x, merged.features.shape[1])
        x = x.replace_feature(merged.features + x.features)
        return conv_inv(x)

    def forward(self, x):
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv2 = self.conv2(x_conv1)
        x_conv3 = self.conv3(x_conv2)
        bev = _bev(self.conv_out(x_conv3))
        up3 = self._ur_block(x_conv3, x_conv3, self.conv_up_t3, self.conv_up_m3, self.inv_conv3)
        up2 = self._ur_block(x_conv2, up3, self.conv_up_t2, self.conv_up_m2, self.inv_conv2)
        up1 = self._ur_block(x_conv1, up2, self.conv_up_t1, self.conv_up_m1, self.conv5)
        voxel_size = torch.tensor([0.05, 0.05, 0.1], dtype=up1.features.dtype)
        centres = (up1.indices[:, [3, 2, 1]].to(up1.features.dtype) + 0.5) * voxel_size
        points = torch.cat((up1.indices[:, 0:1].to(up1.features.dtype), centres), dim=1)
        return {"bev": bev, "seg": up1, "points": up1.replace_feature(points)}


def _voxelnext_merge(x_conv4, x_conv5, x_conv6):
    """VoxelNeXt's gathering of the coarse levels onto stride 8: in-place index scaling, the features replaced by
    a longer concatenation, then the indices assigned on the next statement."""
    x_conv5.indices[:, 1:] *= 2
    x_conv6.indices[:, 1:] *= 4
    x_conv4 = x_conv4.replace_feature(torch.cat([x_conv4.features, x_conv5.features, x_conv6.features]))
    x_conv4.indices = torch.cat([x_conv4.indices, x_conv5.indices, x_conv6.indices])
    return x_conv4


def _bev_out(sp, x_conv, columns, spatial_shape):
    """Merges the rows that share (batch, y, x): torch.unique(return_inverse=True) and a scatter-add of features."""
    unique, inverse = torch.unique(x_conv.indices[:, columns], dim=0, return_inverse=True)
    features = x_conv.features.new_zeros((unique.shape[0], x_conv.features.shape[1]))
    features.index_add_(0, inverse, x_conv.features)
    return sp.SparseConvTensor(features=features, indices=unique, spatial_shape=spatial_shape,
                               batch_size=x_conv.batch_size)


class _VoxelNeXtHead(nn.Module):
    """VoxelNeXt-style sparse head: branches of SubMConv2d + BatchNorm1d + ReLU sharing one indice_key (the first
    branch builds the map, the others reuse it), reading features, indices and spatial_shape of the BEV tensor."""

    def __init__(self, sp, c):
        super().__init__()
        self.heads = nn.ModuleDict({
            name: sp.SparseSequential(sp.SubMConv2d(c, c, 3, padding=1, bias=False, indice_key="head"), _bn(c),
                                      nn.ReLU(), sp.SubMConv2d(c, out, 1, bias=True, indice_key="head_out"))
            for name, out in (("hm", 2), ("center", 2), ("dim", 3))})

    def forward(self, x):
        out = {name: head(x).features for name, head in self.heads.items()}
        ys, xs = x.indices[:, 1].to(x.features.dtype), x.indices[:, 2].to(x.features.dtype)
        box = torch.cat([out["hm"].sigmoid(), out["center"] + torch.stack([xs, ys], 1), out["dim"].exp()], 1)
        return x.replace_feature(box)


class PcdetVoxelNeXt(nn.Module):
    """OpenPCDet VoxelResBackBone8xVoxelNeXt: residual stages down to stride 32, conv5/conv6 gathered onto stride 8,
    bev_out, SparseConv2d / SubMConv2d output convs (2-D after 3-D in one model) and a sparse head."""
    INPUT = dict(shape=(41, 32, 32), cin=4, n=300)

    def __init__(self, sp, cin):
        super().__init__()
        self.sp = sp
        res = _res_block_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 4, 3, padding=1, bias=False, indice_key="subm1"),
                                              _bn(4), nn.ReLU())
        self.conv1 = sp.SparseSequential(res(4, "res1"))
        chans = [4, 8, 8, 8, 8, 8]
        for i in range(2, 7):
            setattr(self, f"conv{i}", sp.SparseSequential(
                _block(sp, chans[i - 2], chans[i - 1], 3, f"spconv{i}", "spconv", 2, 1), res(chans[i - 1], f"res{i}")))
        self.conv_out = sp.SparseSequential(sp.SparseConv2d(8, 8, 3, stride=1, padding=1, bias=False,
                                                            indice_key="spconv_down2"), _bn(8), nn.ReLU())
        self.shared_conv = sp.SparseSequential(sp.SubMConv2d(8, 8, 3, stride=1, padding=1, bias=True),
                                               nn.BatchNorm1d(8), nn.ReLU(True))
        self.head = _VoxelNeXtHead(sp, 8)

    def forward(self, x):
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv4 = self.conv4(self.conv3(self.conv2(x_conv1)))
        x_conv5 = self.conv5(x_conv4)
        x_conv6 = self.conv6(x_conv5)
        x_conv4 = _voxelnext_merge(x_conv4, x_conv5, x_conv6)
        out = _bev_out(self.sp, x_conv4, [0, 2, 3], x_conv4.spatial_shape[1:])
        out = self.shared_conv(self.conv_out(out))
        return {"x_conv4": x_conv4, "out": out, "boxes": self.head(out)}


class PcdetVoxelNeXt2D(nn.Module):
    """OpenPCDet VoxelResBackBone8xVoxelNeXt2D: the same on pillars, SubMConv2d / SparseConv2d throughout."""
    INPUT = dict(shape=(32, 32), cin=4, n=150)

    def __init__(self, sp, cin):
        super().__init__()
        self.sp = sp
        res = _res_block_class(sp)
        self.conv1 = sp.SparseSequential(res(cin, "res1", dim=2), res(cin, "res1", dim=2))
        chans = [cin, 8, 8, 8, 8, 8]
        for i in range(2, 7):
            setattr(self, f"conv{i}", sp.SparseSequential(
                _block(sp, chans[i - 2], chans[i - 1], 3, f"spconv{i}", "spconv", 2, 1, dim=2),
                res(chans[i - 1], f"res{i}", dim=2)))
        self.conv_out = sp.SparseSequential(sp.SparseConv2d(8, 8, 3, stride=1, padding=1, bias=False,
                                                            indice_key="spconv_down2"), _bn(8), nn.ReLU())
        self.shared_conv = sp.SparseSequential(sp.SubMConv2d(8, 8, 3, stride=1, padding=1, bias=True),
                                               nn.BatchNorm1d(8), nn.ReLU(True))

    def forward(self, x):
        x_conv1 = self.conv1(x)
        x_conv4 = self.conv4(self.conv3(self.conv2(x_conv1)))
        x_conv5 = self.conv5(x_conv4)
        x_conv6 = self.conv6(x_conv5)
        x_conv4 = _voxelnext_merge(x_conv4, x_conv5, x_conv6)
        out = _bev_out(self.sp, x_conv4, [0, 1, 2], x_conv4.spatial_shape)
        return {"x_conv4": x_conv4, "out": self.shared_conv(self.conv_out(out))}


class PcdetPillarRes18(nn.Module):
    """OpenPCDet PillarRes18BackBone8x: 2-D residual sparse stages, then dense() into nn.Conv2d stages; the last
    sparse stage is also read channels-last (dense(channels_first=False))."""
    INPUT = dict(shape=(32, 32), cin=4, n=150)

    def __init__(self, sp, cin):
        super().__init__()
        res = _res_block_class(sp)
        self.conv1 = sp.SparseSequential(res(cin, "res1", dim=2))
        self.conv2 = sp.SparseSequential(_block(sp, cin, 8, 3, "spconv2", "spconv", 2, 1, dim=2), res(8, "res2", dim=2))
        self.conv3 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv3", "spconv", 2, 1, dim=2), res(8, "res3", dim=2))
        self.conv4 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv4", "spconv", 2, 1, dim=2), res(8, "res4", dim=2))
        self.conv5 = nn.Sequential(nn.Conv2d(8, 8, 3, 2, padding=1, bias=False),
                                   nn.BatchNorm2d(8, eps=1e-3, momentum=0.01), nn.ReLU())

    def forward(self, x):
        x_conv4 = self.conv4(self.conv3(self.conv2(self.conv1(x))))
        return {"x_conv5": self.conv5(x_conv4.dense()), "x_conv4_nhwc": x_conv4.dense(channels_first=False)}


def _focal_class(sp):
    class FocalSparseConv(sp.SparseModule):
        """OpenPCDet's focal sparse conv: a SubM importance branch, sigmoid scores, the top half of each batch
        entry's voxels kept as foreground and dilated where a kernel offset scores >= 0.5, duplicates merged by
        torch.unique, foreground / background rebuilt as SparseConvTensors and recombined, then a SubM conv."""

        def __init__(self, c, key):
            super().__init__()
            self.conv = sp.SubMConv3d(c, c, 3, stride=1, bias=False, indice_key=key)
            self.bn1 = _bn(c)
            self.relu = nn.ReLU(True)
            self.conv_imp = sp.SubMConv3d(c, 27, 3, stride=1, padding=1, bias=False, indice_key=key + "_imp")
            offsets = [[i, j, k] for i in (-1, 0, 1) for j in (-1, 0, 1) for k in (-1, 0, 1)]
            offsets.remove([0, 0, 0])
            self.register_buffer("offsets", torch.tensor(offsets, dtype=torch.int32), persistent=False)

        @staticmethod
        def _merge(features, coords, weights=None):
            unique, inverse = torch.unique(coords, dim=0, return_inverse=True)
            merged = features.new_zeros((unique.shape[0], features.shape[1])).index_add_(0, inverse, features)
            if weights is None:
                return merged, unique, None
            counts = torch.bincount(inverse, minlength=unique.shape[0]).to(weights.dtype)
            return merged, unique, weights.new_zeros(unique.shape[0]).index_add_(0, inverse, weights) / counts

        def _split(self, x, b, imps):
            rows = x.indices[:, 0] == b
            coords, feats = x.indices[rows], x.features[rows]
            voxel_score, kernel_score = imps[rows, -1].sigmoid(), imps[rows, :-1].sigmoid()
            order = voxel_score.sort(descending=True)[1]
            fore, back = order[:int(order.shape[0] * 0.5)], order[int(order.shape[0] * 0.5):]
            keep = kernel_score[fore] >= 0.5
            grown = (coords[fore, 1:].unsqueeze(1) + self.offsets.unsqueeze(0))[keep]
            inside = ((grown >= 0) & (grown < torch.tensor(x.spatial_shape, dtype=grown.dtype))).all(dim=1)
            grown, grown_score = grown[inside], kernel_score[fore][keep][inside]
            grown = torch.cat([torch.full_like(grown[:, :1], b), grown], dim=1)
            f, c, w = self._merge(torch.cat([feats[fore], feats.new_zeros((grown.shape[0], feats.shape[1]))]),
                                  torch.cat([coords[fore], grown]),
                                  torch.cat([feats.new_ones(fore.shape[0]), grown_score.to(feats.dtype)]))
            return f, c, feats[back], coords[back], w

        def forward(self, x):
            imps = self.conv_imp(x).features
            parts = [self._split(x, b, imps) for b in range(x.batch_size)]
            fore = sp.SparseConvTensor(torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]),
                                       x.spatial_shape, x.batch_size)
            back = sp.SparseConvTensor(torch.cat([p[2] for p in parts]), torch.cat([p[3] for p in parts]),
                                       x.spatial_shape, x.batch_size)
            fore = fore.replace_feature(fore.features * torch.cat([p[4] for p in parts]).unsqueeze(-1))
            features, indices, _ = self._merge(torch.cat([fore.features, back.features]),
                                               torch.cat([fore.indices, back.indices]))
            out = fore.replace_feature(features)
            out.indices = indices
            out = self.conv(out)
            out = out.replace_feature(self.bn1(out.features))
            return out.replace_feature(self.relu(out.features))
    return FocalSparseConv


class PcdetVoxelBackBone8xFocal(nn.Module):
    """OpenPCDet VoxelBackBone8xFocal: focal sparse convs after the first two stages, in SparseSequentials with
    nn modules (ReLU(inplace=True)), then the stride-2 stages and the z-squeeze."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        focal = _focal_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 4, 3, padding=1, bias=False, indice_key="subm1"),
                                              _bn(4), nn.ReLU(True))
        self.conv1 = sp.SparseSequential(_block(sp, 4, 4, 3, "subm1", padding=1, inplace=True), focal(4, "focal1"))
        self.conv2 = sp.SparseSequential(_block(sp, 4, 8, 3, "spconv2", "spconv", 2, 1, inplace=True),
                                         _block(sp, 8, 8, 3, "subm2", padding=1, inplace=True), focal(8, "focal2"))
        self.conv3 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv3", "spconv", 2, 1, inplace=True))
        self.conv4 = sp.SparseSequential(_block(sp, 8, 8, 3, "spconv4", "spconv", 2, (0, 1, 1), inplace=True))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(8, 8, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _bn(8), nn.ReLU(True))

    def forward(self, x):
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv2 = self.conv2(x_conv1)
        out = self.conv_out(self.conv4(self.conv3(x_conv2)))
        return {"x_conv1": x_conv1, "x_conv2": x_conv2, "bev": _bev(out)}


def _mmdet_block_class(sp):
    class SparseBasicBlock(sp.SparseModule):
        """mmdetection3d's SparseBasicBlock: SubMConv3d built from a conv config without an indice_key (each conv
        builds its own map), the identity kept as a plain feature tensor."""

        def __init__(self, c, key=None):
            super().__init__()
            extra = {} if key is None else {"indice_key": key}
            self.conv1 = sp.SubMConv3d(c, c, 3, stride=1, padding=1, dilation=1, bias=False, **extra)
            self.norm1 = _bn(c)
            self.conv2 = sp.SubMConv3d(c, c, 3, stride=1, padding=1, dilation=1, bias=False, **extra)
            self.norm2 = _bn(c)
            self.relu = nn.ReLU(inplace=True)

        def forward(self, x):
            identity = x.features
            assert x.features.dim() == 2
            out = self.conv1(x)
            out = out.replace_feature(self.norm1(out.features))
            out = out.replace_feature(self.relu(out.features))
            out = self.conv2(out)
            out = out.replace_feature(self.norm2(out.features))
            out = out.replace_feature(out.features + identity)
            return out.replace_feature(self.relu(out.features))
    return SparseBasicBlock


def _encoder_layers(sp, channels, paddings, block_type="conv_module"):
    """mmdetection3d's make_encoder_layers: a SparseSequential filled by add_module with one SparseSequential per
    stage; a stage starts with a stride-2 SparseConv3d (conv modules) or ends with one (basic blocks)."""
    block = _mmdet_block_class(sp)
    layers = sp.SparseSequential()
    cin = channels[0][0]
    for i, stage in enumerate(channels):
        mods = []
        for j, cout in enumerate(stage):
            pad = paddings[i][j]
            if block_type == "conv_module" and i != 0 and j == 0:
                mods.append(_block(sp, cin, cout, 3, f"spconv{i + 1}", "spconv", 2, pad, inplace=True))
            elif block_type == "basicblock" and j == len(stage) - 1 and i != len(channels) - 1:
                mods.append(_block(sp, cin, cout, 3, f"spconv{i + 1}", "spconv", 2, pad, inplace=True))
            elif block_type == "basicblock":
                mods.append(block(cout))
            else:
                mods.append(_block(sp, cin, cout, 3, f"subm{i + 1}", padding=pad, inplace=True))
            cin = cout
        layers.add_module(f"encoder_layer{i + 1}", sp.SparseSequential(*mods))
    return layers


class MmdetSparseEncoderBasicBlock(nn.Module):
    """mmdetection3d SparseEncoder with block_type='basicblock'."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        self.conv_input = _block(sp, cin, 4, 3, "subm1", padding=1, inplace=True)
        self.encoder_layers = _encoder_layers(sp, ((4, 4, 8), (8, 8, 8), (8, 8)),
                                              ((0, 0, 1), (0, 0, (0, 1, 1)), (0, 0)), "basicblock")
        self.conv_out = _block(sp, 8, 8, (3, 1, 1), "spconv_down2", "spconv", (2, 1, 1), 0, inplace=True)

    def forward(self, x):
        x = self.conv_input(x)
        feats = []
        for layer in self.encoder_layers:
            x = layer(x)
            feats.append(x)
        return {"enc2": feats[1], "bev": _bev(self.conv_out(feats[-1]))}


class MmdetSparseEncoderSASSD(nn.Module):
    """mmdetection3d SparseEncoderSASSD: the encoder, its dense BEV, and the auxiliary point branch that reads each
    stage's indices as voxel centres, interpolates their features onto the points (3 nearest, inverse distance)
    and classifies / regresses per point."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        self.conv_input = _block(sp, cin, 4, 3, "subm1", padding=1, inplace=True)
        self.encoder_layers = _encoder_layers(sp, ((4,), (8, 8), (8, 8), (8, 8)),
                                              ((1,), (1, 1), (1, 1), ((0, 1, 1), 1)))
        self.conv_out = _block(sp, 8, 8, (3, 1, 1), "spconv_down2", "spconv", (2, 1, 1), 0, inplace=True)
        self.point_fc = nn.Linear(20, 8, bias=False)
        self.point_cls = nn.Linear(8, 1, bias=False)
        self.point_reg = nn.Linear(8, 3, bias=False)

    @staticmethod
    def _aux_points(source, points, voxel_size):
        """Features of ``source`` at bxyz ``points``: its sites as xyz voxel centres, 3 nearest per batch entry."""
        vs = torch.tensor(voxel_size, dtype=points.dtype)
        centres = (source.indices[:, [3, 2, 1]].to(points.dtype) + 0.5) * vs
        out = points.new_zeros((points.shape[0], source.features.shape[1]))
        for b in range(source.batch_size):
            src, dst = source.indices[:, 0] == b, points[:, 0] == b
            dist, idx = torch.cdist(points[dst, 1:], centres[src]).topk(3, dim=1, largest=False)
            weight = 1.0 / (dist + 1e-8)
            weight = weight / weight.sum(dim=1, keepdim=True)
            out[dst] = (source.features[src][idx] * weight.unsqueeze(-1)).sum(dim=1)
        return out

    def forward(self, x):
        voxel_features, coors = x.features, x.indices
        x = self.conv_input(x)
        feats = []
        for layer in self.encoder_layers:
            x = layer(x)
            feats.append(x)
        bev = _bev(self.conv_out(feats[-1]))
        # points inside the input voxels (voxel size 0.05, 0.05, 0.1; xyz from zyx indices, offsets from features)
        base = torch.tensor([0.05, 0.05, 0.1], dtype=voxel_features.dtype)
        xyz = (coors[:, [3, 2, 1]].to(voxel_features.dtype) + 0.5 + 0.4 * voxel_features[:, :3].detach()) * base
        points_mean = torch.cat([coors[:, :1].to(voxel_features.dtype), xyz], dim=1)
        p0 = self._aux_points(feats[0], points_mean, (0.05, 0.05, 0.1))
        p1 = self._aux_points(feats[1], points_mean, (0.1, 0.1, 0.2))
        p2 = self._aux_points(feats[2], points_mean, (0.2, 0.2, 0.4))
        pointwise = self.point_fc(torch.cat([p0, p1, p2], dim=-1))
        return {"bev": bev, "point_cls": self.point_cls(pointwise), "point_reg": self.point_reg(pointwise)}


class MmdetSparseUNet(nn.Module):
    """mmdetection3d SparseUNet (PartA2): make_sparse_convmodule stages, a decoder of lateral SparseBasicBlocks
    (conv config with the stage's indice_key), merge convs, channel reduction, inverse-conv upsampling and a SubM
    last upsample. Its weights are loaded from an mmcv spconv 1.x checkpoint through mmdetection3d's spconv-2
    state-dict hook (``LOAD``)."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)
    LOAD = "mmdet3d_spconv1"

    def __init__(self, sp, cin):
        super().__init__()
        block = _mmdet_block_class(sp)
        self.conv_input = _block(sp, cin, 4, 3, "subm1", padding=1, inplace=True)
        enc = ((4,), (8, 8), (8, 8), (8, 8))
        self.encoder_layers = _encoder_layers(sp, enc, ((1,), (1, 1), (1, 1), ((0, 1, 1), 1)))
        self.conv_out = _block(sp, 8, 8, (3, 1, 1), "spconv_down2", "spconv", (2, 1, 1), 0, inplace=True)
        dec = ((8, 8, 8), (8, 8, 8), (8, 8, 4), (4, 4, 4))
        pads = ((1, 0), (1, 0), (0, 0), (0, 1))
        cin = 8
        for i, chans in enumerate(dec):
            n = len(dec) - i
            setattr(self, f"lateral_layer{n}", block(cin, key=f"subm{n}"))
            setattr(self, f"merge_layer{n}", _block(sp, cin * 2, chans[1], 3, f"subm{n}", padding=pads[i][0],
                                                    inplace=True))
            if n != 1:
                setattr(self, f"upsample_layer{n}", _block(sp, cin, chans[2], 3, f"spconv{n}", "inverse",
                                                           inplace=True))
            else:
                setattr(self, f"upsample_layer{n}", _block(sp, cin, chans[2], 3, "subm1", padding=pads[i][1],
                                                           inplace=True))
            cin = chans[2]

    @staticmethod
    def _reduce_channel(x, out_channels):
        f = x.features
        n, c = f.shape
        assert c % out_channels == 0 and c >= out_channels
        return x.replace_feature(f.view(n, out_channels, -1).sum(dim=2))

    def forward(self, x):
        x = self.conv_input(x)
        feats = []
        for layer in self.encoder_layers:
            x = layer(x)
            feats.append(x)
        bev = _bev(self.conv_out(feats[-1]))
        x = feats[-1]
        for i in range(len(feats), 0, -1):
            lateral = getattr(self, f"lateral_layer{i}")(feats[i - 1])
            y = lateral.replace_feature(torch.cat((x.features, lateral.features), dim=1))
            merged = getattr(self, f"merge_layer{i}")(y)
            y = self._reduce_channel(y, merged.features.shape[1])
            y = y.replace_feature(merged.features + y.features)
            x = getattr(self, f"upsample_layer{i}")(y)
        return {"bev": bev, "seg": x}


def _pointcept_block_class(sp):
    class BasicBlock(sp.SparseModule):
        """Pointcept's BasicBlock: proj is SparseSequential(nn.Identity()) or a 1x1 SubM (no key) + norm."""

        def __init__(self, cin, c, key):
            super().__init__()
            if cin == c:
                self.proj = sp.SparseSequential(nn.Identity())
            else:
                self.proj = sp.SparseSequential(sp.SubMConv3d(cin, c, kernel_size=1, bias=False), _bn(c))
            self.conv1 = sp.SubMConv3d(cin, c, kernel_size=3, stride=1, padding=1, bias=False, indice_key=key)
            self.bn1 = _bn(c)
            self.relu = nn.ReLU()
            self.conv2 = sp.SubMConv3d(c, c, kernel_size=3, stride=1, padding=1, bias=False, indice_key=key)
            self.bn2 = _bn(c)

        def forward(self, x):
            residual = x
            out = self.conv1(x)
            out = out.replace_feature(self.relu(self.bn1(out.features)))
            out = self.conv2(out)
            out = out.replace_feature(self.bn2(out.features))
            out = out.replace_feature(out.features + self.proj(residual).features)
            return out.replace_feature(self.relu(out.features))
    return BasicBlock


class PointceptSpUNetV1m1(nn.Module):
    """Pointcept SpUNet-v1m1: the tensor built from grid_coord / offset (spatial shape max + 96 as a list from a
    tensor), kernel-5 stem, encoder of kernel-2 stride-2 SparseConv3d + BasicBlocks in OrderedDict SparseSequentials,
    decoder of kernel-2 SparseInverseConv3d with the skip concatenated through replace_feature, kernel-1 head."""
    INPUT = dict(shape=(17, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin, channels=(8, 8, 8, 8), layers=(1, 2, 1, 1)):
        super().__init__()
        self.sp = sp
        block = _pointcept_block_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 4, kernel_size=5, padding=1, bias=False,
                                                            indice_key="stem"), _bn(4), nn.ReLU())
        self.down, self.enc, self.up, self.dec = nn.ModuleList(), nn.ModuleList(), nn.ModuleList(), nn.ModuleList()
        stages = len(layers) // 2
        enc_c, dec_c = 4, channels[-1]
        for s in range(stages):
            self.down.append(sp.SparseSequential(sp.SparseConv3d(enc_c, channels[s], kernel_size=2, stride=2,
                                                                 bias=False, indice_key=f"spconv{s + 1}"),
                                                 _bn(channels[s]), nn.ReLU()))
            self.enc.append(sp.SparseSequential(OrderedDict(
                (f"block{i}", block(channels[s], channels[s], f"subm{s + 1}")) for i in range(layers[s]))))
            self.up.append(sp.SparseSequential(sp.SparseInverseConv3d(channels[len(channels) - s - 2], dec_c,
                                                                      kernel_size=2, bias=False,
                                                                      indice_key=f"spconv{s + 1}"),
                                               _bn(dec_c), nn.ReLU()))
            self.dec.append(sp.SparseSequential(OrderedDict(
                (f"block{i}", block(dec_c + enc_c if i == 0 else dec_c, dec_c, f"subm{s}"))
                for i in range(layers[len(channels) - s - 1]))))
            enc_c, dec_c = channels[s], channels[len(channels) - s - 2]
        self.final = sp.SubMConv3d(channels[-1], 3, kernel_size=1, padding=1, bias=True)

    def forward(self, x):
        grid_coord, feat = x.indices[:, 1:].long(), x.features
        counts = torch.bincount(x.indices[:, 0].long())
        offset = counts.cumsum(0)
        batch = torch.repeat_interleave(torch.arange(len(offset)), torch.diff(offset, prepend=offset.new_zeros(1)))
        x = self.sp.SparseConvTensor(
            features=feat, indices=torch.cat([batch.unsqueeze(-1).int(), grid_coord.int()], dim=1).contiguous(),
            spatial_shape=torch.add(torch.max(grid_coord, dim=0).values, 96).tolist(),
            batch_size=batch[-1].tolist() + 1)
        x = self.conv_input(x)
        skips = [x]
        for s in range(len(self.down)):
            x = self.enc[s](self.down[s](x))
            skips.append(x)
        x = skips.pop(-1)
        for s in reversed(range(len(self.down))):
            x = self.up[s](x)
            skip = skips.pop(-1)
            x = x.replace_feature(torch.cat((x.features, skip.features), dim=1))
            x = self.dec[s](x)
        return {"seg": self.final(x)}


class CenterPointSpMiddleResNetFHD(nn.Module):
    """CenterPoint SpMiddleResNetFHD: spatial shape a numpy array (input_shape[::-1] + [1, 0, 0]), SubM stem without
    padding, residual blocks sharing res keys, key-less stride-2 SparseConv3d with ReLU(inplace=True), extra_conv."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        self.sp = sp
        res = _res_block_class(sp)
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 6, 3, bias=False, indice_key="res0"), _bn(6),
                                              nn.ReLU(inplace=True))
        self.conv1 = sp.SparseSequential(res(6, "res0"), res(6, "res0"))
        self.conv2 = sp.SparseSequential(sp.SparseConv3d(6, 8, 3, 2, padding=1, bias=False), _bn(8),
                                         nn.ReLU(inplace=True), res(8, "res1"))
        self.conv3 = sp.SparseSequential(sp.SparseConv3d(8, 8, 3, 2, padding=1, bias=False), _bn(8),
                                         nn.ReLU(inplace=True), res(8, "res2"))
        self.conv4 = sp.SparseSequential(sp.SparseConv3d(8, 8, 3, 2, padding=[0, 1, 1], bias=False), _bn(8),
                                         nn.ReLU(inplace=True), res(8, "res3"))
        self.extra_conv = sp.SparseSequential(sp.SparseConv3d(8, 8, (3, 1, 1), (2, 1, 1), bias=False), _bn(8),
                                              nn.ReLU())

    def forward(self, x):
        input_shape = list(x.spatial_shape[::-1])
        input_shape[-1] -= 1
        sparse_shape = np.array(input_shape[::-1]) + [1, 0, 0]
        x = self.sp.SparseConvTensor(x.features, x.indices.int(), sparse_shape, x.batch_size)
        x_conv1 = self.conv1(self.conv_input(x))
        x_conv4 = self.conv4(self.conv3(self.conv2(x_conv1)))
        return {"bev": _bev(self.extra_conv(x_conv4)), "conv1": x_conv1, "conv4": x_conv4}


class CenterPointSpMiddleFHD(nn.Module):
    """CenterPoint SpMiddleFHD: one long SparseSequential of SubM / key-less strided convs, norms and ReLUs."""
    INPUT = dict(shape=(41, 16, 16), cin=4, n=200)

    def __init__(self, sp, cin):
        super().__init__()
        mods = [sp.SubMConv3d(cin, 4, 3, bias=False, indice_key="subm0"), _bn(4), nn.ReLU(),
                sp.SubMConv3d(4, 4, 3, bias=False, indice_key="subm0"), _bn(4), nn.ReLU()]
        c = 4
        for i, (cout, pad, subms) in enumerate(((8, 1, 2), (8, 1, 2), (8, [0, 1, 1], 1))):
            mods += [sp.SparseConv3d(c, cout, 3, 2, padding=pad, bias=False), _bn(cout), nn.ReLU()]
            for _ in range(subms):
                mods += [sp.SubMConv3d(cout, cout, 3, indice_key=f"subm{i + 1}", bias=False), _bn(cout), nn.ReLU()]
            c = cout
        mods += [sp.SparseConv3d(c, 8, (3, 1, 1), (2, 1, 1), bias=False), _bn(8), nn.ReLU()]
        self.middle_conv = sp.SparseSequential(*mods)

    def forward(self, x):
        return {"bev": _bev(self.middle_conv(x))}


BUILDERS = {"pcdet_voxel_backbone8x": PcdetVoxelBackBone8x, "pcdet_voxel_res_backbone8x": PcdetVoxelResBackBone8x,
            "pcdet_unetv2": PcdetUNetV2, "pcdet_voxelnext": PcdetVoxelNeXt, "pcdet_voxelnext2d": PcdetVoxelNeXt2D,
            "pcdet_pillar_res18": PcdetPillarRes18, "pcdet_focal": PcdetVoxelBackBone8xFocal,
            "mmdet3d_encoder_basicblock": MmdetSparseEncoderBasicBlock, "mmdet3d_sassd": MmdetSparseEncoderSASSD,
            "mmdet3d_sparse_unet": MmdetSparseUNet, "pointcept_spunet_v1m1": PointceptSpUNetV1m1,
            "centerpoint_resnet_fhd": CenterPointSpMiddleResNetFHD, "centerpoint_fhd": CenterPointSpMiddleFHD}
