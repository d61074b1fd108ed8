"""Networks and workflows of the int8 benchmark rows and the quantization tests: the residual network of spconv 2.x's
int8 guide (fusible and unfusible blocks), an OpenPCDet-style VoxelBackBone8x, and the PTQ / QAT workflow."""
import warnings
from typing import Callable, Iterable, List, Tuple

import torch
import torch.ao.quantization.quantize_fx as qfx
import torch.nn.functional as F
from torch import nn
from torch.ao.quantization import DeQuantStub, QuantStub

import spconv.pytorch as spconv
import spconv.pytorch.quantization as spconvq


def conv_bn_relu(conv, cout: int) -> spconv.SparseSequential:
    return spconv.SparseSequential(conv, nn.BatchNorm1d(cout, momentum=0.1), nn.ReLU(inplace=False))


class FusibleBlock(spconv.SparseModule):
    """The residual block of spconv's int8 guide: ``relu(out + identity)`` on SparseConvTensors fuses into one
    conv-bn-add-relu."""

    def __init__(self, c: int, ndim: int = 2, key: str = "res"):
        super().__init__()
        sub = {2: spconv.SubMConv2d, 3: spconv.SubMConv3d}[ndim]
        self.conv1_bn_relu = spconv.SparseSequential(conv=sub(c, c, 3, 1, 1, bias=False, indice_key=key),
                                                     bn=nn.BatchNorm1d(c), relu=nn.ReLU(inplace=True))
        self.conv2_bn = spconv.SparseSequential(conv=sub(c, c, 3, 1, 1, bias=False, indice_key=key),
                                                bn=nn.BatchNorm1d(c))
        self.relu = spconv.SparseReLU(inplace=True)
        self.iden_for_fx_match = spconv.SparseIdentity()

    def forward(self, x):
        identity = x
        out = self.conv1_bn_relu(x)
        out = self.conv2_bn(out)
        return self.relu(out + identity)


class UnfusibleBlock(FusibleBlock):
    """The same block written with ``replace_feature`` / ``.features``: it can't fuse, and must still run."""

    def __init__(self, c: int, ndim: int = 2, key: str = "res"):
        super().__init__(c, ndim, key)
        self.relu = nn.ReLU(inplace=True)

    def forward(self, x):
        identity = x.features
        out = self.conv1_bn_relu(x)
        out = self.conv2_bn(out)
        return out.replace_feature(self.relu(out.features + identity))


class ResidualNet(nn.Module):
    """spconv's int8 example network on 28 x 28 images, ending in a dense tensor."""

    def __init__(self, block=FusibleBlock):
        super().__init__()
        self.net = spconv.SparseSequential(
            conv_bn_relu(spconv.SubMConv2d(1, 32, 3, 1, 1, bias=False), 32),
            block(32),
            conv_bn_relu(spconv.SubMConv2d(32, 64, 3, 1, 1, bias=False), 64),
            conv_bn_relu(spconv.SparseConv2d(64, 64, 2, 2, bias=False), 64),
            conv_bn_relu(spconv.SparseConv2d(64, 64, 2, 2, bias=False), 64),
            conv_bn_relu(spconv.SparseConv2d(64, 64, 3, 2, 1, bias=False), 64),
            spconv.SparseConv2d(64, 10, 4, 4),
            spconv.ToDense(),
        )
        self.quant = QuantStub()
        self.dequant = DeQuantStub()

    def forward(self, features: torch.Tensor, indices: torch.Tensor, batch_size: int):
        features = self.quant(features)
        x = spconv.SparseConvTensor(features, indices, [28, 28], batch_size)
        x = self.net(x)
        x = torch.flatten(x, 1)
        x = self.dequant(x)
        return F.log_softmax(x, dim=1)


def image_batch(generator: torch.Generator, batch: int = 4, fill: float = 0.3) -> Tuple[torch.Tensor, ...]:
    d = torch.rand(batch, 28, 28, 1, generator=generator)
    d = d * (torch.rand(batch, 28, 28, 1, generator=generator) < fill)
    sp = spconv.SparseConvTensor.from_dense(d)
    return sp.features, sp.indices, sp.batch_size


class VoxelBackBone8x(nn.Module):
    """The layer structure of OpenPCDet's VoxelBackBone8x (4 stages, stride 8, BN + ReLU after every conv), on
    voxel features; returns the stride-8 features as a dequantized SparseConvTensor's features."""

    def __init__(self, in_channels: int, sparse_shape: List[int]):
        super().__init__()
        self.sparse_shape = sparse_shape

        def subm(cin, cout, key):
            return conv_bn_relu(spconv.SubMConv3d(cin, cout, 3, padding=1, bias=False, indice_key=key), cout)

        def down(cin, cout, key, padding=1):
            return conv_bn_relu(spconv.SparseConv3d(cin, cout, 3, 2, padding, bias=False, indice_key=key), cout)

        self.conv_input = subm(in_channels, 16, "subm1")
        self.conv1 = spconv.SparseSequential(subm(16, 16, "subm1"))
        self.conv2 = spconv.SparseSequential(down(16, 32, "spconv2"), subm(32, 32, "subm2"), subm(32, 32, "subm2"))
        self.conv3 = spconv.SparseSequential(down(32, 64, "spconv3"), subm(64, 64, "subm3"), subm(64, 64, "subm3"))
        self.conv4 = spconv.SparseSequential(down(64, 64, "spconv4", (0, 1, 1)), subm(64, 64, "subm4"),
                                             subm(64, 64, "subm4"))
        self.conv_out = conv_bn_relu(spconv.SparseConv3d(64, 128, (3, 1, 1), (2, 1, 1), bias=False,
                                                         indice_key="spconv_down2"), 128)
        self.quant = QuantStub()

    def forward(self, voxel_features: torch.Tensor, voxel_coords: torch.Tensor, batch_size: int):
        x = spconv.SparseConvTensor(self.quant(voxel_features), voxel_coords, self.sparse_shape, batch_size)
        x = self.conv_input(x)
        x = self.conv1(x)
        x = self.conv2(x)
        x = self.conv3(x)
        x = self.conv4(x)
        return self.conv_out(x).dequantize().features


def random_scene(generator: torch.Generator, shape: List[int], n: int, channels: int = 4):
    """Clustered voxels (surfaces of a few boxes) with smooth features, batch 1."""
    centers = torch.rand(8, 3, generator=generator) * torch.tensor(shape)
    pts = centers[torch.randint(0, 8, (n * 2,), generator=generator)]
    pts = pts + torch.randn(n * 2, 3, generator=generator) * torch.tensor(shape) / 12
    coords = pts.round().long()
    ok = ((coords >= 0) & (coords < torch.tensor(shape))).all(1)
    coords = torch.unique(coords[ok], dim=0)[:n]
    feats = torch.cat([coords.float() / torch.tensor(shape), torch.rand(coords.shape[0], channels - 3,
                                                                           generator=generator)], 1)
    indices = torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.long), coords], 1).int()
    return feats, indices, 1


def train_a_little(model: nn.Module, batches: Iterable[Tuple], steps: int = 4, lr: float = 1e-2):
    """A few optimizer steps on a self-supervised loss, so weights and batch-norm statistics look trained."""
    model.train()
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    batches = list(batches)
    for _, inputs in zip(range(steps), batches):
        out = model(*inputs).float()
        # spread the channels: unit variance per channel, decorrelated from a fixed random projection
        target = torch.sin(out.detach() @ torch.ones(out.shape[1], out.shape[1]) / out.shape[1] * 3)
        loss = (out - target).pow(2).mean() + (out.std(0) - 1).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    settle_batch_norms(model, batches[:steps])
    return model.eval()


@torch.no_grad()
def settle_batch_norms(model: nn.Module, batches) -> None:
    """Running statistics of the final weights (the plain average over ``batches``), as a trained model has
    them; a few momentum updates would leave them near their initial values."""
    bns = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    saved = [bn.momentum for bn in bns]
    for bn in bns:
        bn.reset_running_stats()
        bn.momentum = None
    model.train()
    for inputs in batches:
        model(*inputs)
    for bn, momentum in zip(bns, saved):
        bn.momentum = momentum


def ptq(model: nn.Module, calib: Iterable[Tuple], with_linear: bool = True):
    """spconv 2.x's documented PTQ workflow; returns (prepared, converted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qconfig_mapping = spconvq.get_default_spconv_qconfig_mapping(False)
        prepare_cfg = spconvq.get_spconv_prepare_custom_config()
        backend_cfg = spconvq.get_spconv_backend_config()
        prepared = qfx.prepare_fx(model, qconfig_mapping, (), backend_config=backend_cfg,
                                  prepare_custom_config=prepare_cfg)
        with torch.no_grad():
            for inputs in calib:
                prepared(*inputs)
        spconvq.prepare_spconv_torch_inference(with_linear)
        converted = qfx.convert_fx(copy_module(prepared), qconfig_mapping=qconfig_mapping, backend_config=backend_cfg)
        converted = spconvq.transform_qdq(converted)
        converted = spconvq.remove_conv_add_dq(converted)
    return prepared, converted


def qat(model: nn.Module, batches: Iterable[Tuple], train: Callable, calib: Iterable[Tuple]):
    """spconv 2.x's documented QAT workflow: prepare_qat_fx, train, freeze bn, convert; (prepared, converted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        qconfig_mapping = spconvq.get_default_spconv_qconfig_mapping(True)
        prepare_cfg = spconvq.get_spconv_prepare_custom_config()
        backend_cfg = spconvq.get_spconv_backend_config()
        model.train()
        prepared = qfx.prepare_qat_fx(model, qconfig_mapping, (), backend_config=backend_cfg,
                                      prepare_custom_config=prepare_cfg)
        train(prepared, batches)
        prepared.apply(lambda m: m.freeze_bn_stats() if hasattr(m, "freeze_bn_stats") else None)
        prepared.eval()
        with torch.no_grad():
            for inputs in calib:
                prepared(*inputs)
        spconvq.prepare_spconv_torch_inference(True)
        converted = qfx.convert_fx(copy_module(prepared), qconfig_mapping=qconfig_mapping, backend_config=backend_cfg)
        converted = spconvq.remove_conv_add_dq(spconvq.transform_qdq(converted))
    return prepared, converted


def copy_module(m: nn.Module) -> nn.Module:
    import copy
    return copy.deepcopy(m)


class BasicNetPTQ(nn.Module):
    """The ``basic`` benchmark network with the quantize stub in front, for the FX workflow."""

    def __init__(self, in_channels: int, spatial_shape: List[int]):
        super().__init__()
        from spconv.benchmark.network import build_basic_net
        self.spatial_shape = spatial_shape
        self.net = build_basic_net(spconv, in_channels)
        self.quant = QuantStub()

    def forward(self, features: torch.Tensor, indices: torch.Tensor, batch_size: int):
        x = spconv.SparseConvTensor(self.quant(features), indices, self.spatial_shape, batch_size)
        return self.net(x).dequantize().features


@torch.no_grad()
def unit_scale_layers(net: nn.Module, inputs: Tuple) -> nn.Module:
    """Rescales each sparse conv's weight, in order, so its output has unit RMS on ``inputs``: the activation
    scale a trained network with batch norms has (a random deep stack without them shrinks geometrically)."""
    convs = [m for m in net.modules() if isinstance(m, spconv.SparseConvolution)]
    for conv in convs:
        seen = {}

        def hook(mod, args, out):
            seen["rms"] = out.features.float().pow(2).mean().sqrt()

        h = conv.register_forward_hook(hook)
        net(*inputs)
        h.remove()
        conv.weight.div_(seen["rms"].clamp_min(1e-12))
    return net
