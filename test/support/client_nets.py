"""Small networks built the way OpenPCDet, mmdetection3d, Pointcept and CenterPoint build theirs from spconv 2.x
(this project's own code: the layer patterns, argument styles and tensor plumbing they use, at test sizes).

Standalone (torch and the ``sp`` module passed in), so the same definitions run on this package and, through
reference_worker.py, on the real spconv 2.3.8.
"""
import torch
from torch import nn


def _norm(c):
    return nn.BatchNorm1d(c, eps=1e-3, momentum=0.01)


def _act_block(sp, cin, cout, k, indice_key, kind="subm", stride=1, padding=0):
    """conv -> BatchNorm1d -> ReLU in a SparseSequential (OpenPCDet's post_act_block, mmdet3d's conv module)."""
    if kind == "subm":
        conv = sp.SubMConv3d(cin, cout, k, bias=False, indice_key=indice_key)
    elif kind == "spconv":
        conv = sp.SparseConv3d(cin, cout, k, stride=stride, padding=padding, bias=False, indice_key=indice_key)
    else:
        conv = sp.SparseInverseConv3d(cin, cout, k, indice_key=indice_key, bias=False)
    return sp.SparseSequential(conv, _norm(cout), nn.ReLU())


class PcdetBackbone8x(nn.Module):
    """Voxel backbone: SubM stem, three stride-2 stages sharing subm keys per resolution, a (3,1,1) z-squeeze."""

    def __init__(self, sp, cin):
        super().__init__()
        self.conv_input = sp.SparseSequential(sp.SubMConv3d(cin, 8, 3, padding=1, bias=False, indice_key="subm1"),
                                              _norm(8), nn.ReLU())
        self.conv1 = sp.SparseSequential(_act_block(sp, 8, 8, 3, "subm1"))
        self.conv2 = sp.SparseSequential(_act_block(sp, 8, 16, 3, "spconv2", "spconv", 2, 1),
                                         _act_block(sp, 16, 16, 3, "subm2"), _act_block(sp, 16, 16, 3, "subm2"))
        self.conv3 = sp.SparseSequential(_act_block(sp, 16, 16, 3, "spconv3", "spconv", 2, (0, 1, 1)),
                                         _act_block(sp, 16, 16, 3, "subm3"))
        self.conv_out = sp.SparseSequential(
            sp.SparseConv3d(16, 32, (3, 1, 1), stride=(2, 1, 1), padding=0, bias=False, indice_key="spconv_down2"),
            _norm(32), nn.ReLU())

    def forward(self, x):
        x1 = self.conv1(self.conv_input(x))
        x2 = self.conv2(x1)
        x3 = self.conv3(x2)
        out = self.conv_out(x3)
        dense = out.dense()
        n, c, d, h, w = dense.shape
        return {"x_conv2": x2, "x_conv3": x3, "bev": dense.view(n, c * d, h, w)}


class PcdetUNet(nn.Module):
    """U-Net: lateral SubM, concat, SubM, channel reduction by summing groups, residual add, inverse conv up."""

    def __init__(self, sp, cin):
        super().__init__()
        self.conv1 = sp.SparseSequential(sp.SubMConv3d(cin, 8, 3, padding=1, bias=False, indice_key="subm1"),
                                         _norm(8), nn.ReLU())
        self.conv2 = sp.SparseSequential(_act_block(sp, 8, 16, 3, "spconv2", "spconv", 2, 1),
                                         _act_block(sp, 16, 16, 3, "subm2"))
        self.lateral = _act_block(sp, 16, 16, 3, "subm2")
        self.merge = _act_block(sp, 32, 16, 3, "subm2")
        self.up = _act_block(sp, 16, 8, 3, "spconv2", "inverse")
        self.lateral1 = _act_block(sp, 8, 8, 3, "subm1")
        self.merge1 = _act_block(sp, 16, 8, 3, "subm1")
        self.head = sp.SubMConv3d(8, 3, 1, bias=True, indice_key="subm1")

    @staticmethod
    def _reduce(x, out_channels):
        f = x.features
        return x.replace_feature(f.view(f.shape[0], out_channels, -1).sum(dim=2))

    def _up(self, lateral, merge, bottom, lateral_in):
        trans = lateral(lateral_in)
        cat = trans.replace_feature(torch.cat((bottom.features, trans.features), dim=1))
        merged = merge(cat)
        reduced = self._reduce(cat, merged.features.shape[1])
        return merged.replace_feature(merged.features + reduced.features)

    def forward(self, x):
        x1 = self.conv1(x)
        x2 = self.conv2(x1)
        y2 = self._up(self.lateral, self.merge, x2, x2)
        y1 = self.up(y2)
        y1 = self._up(self.lateral1, self.merge1, x1, y1)
        return {"seg": self.head(y1)}


class MmdetSparseEncoder(nn.Module):
    """SparseEncoder: conv-norm-act modules, stride-2 SparseConv3d stages with tuple padding, then BEV."""

    def __init__(self, sp, cin):
        super().__init__()
        self.conv_input = _act_block(sp, cin, 8, 3, "subm1")
        self.layers = sp.SparseSequential(
            _act_block(sp, 8, 8, 3, "subm1"),
            _act_block(sp, 8, 16, 3, "spconv2", "spconv", 2, 1), _act_block(sp, 16, 16, 3, "subm2"),
            _act_block(sp, 16, 16, 3, "spconv3", "spconv", 2, (0, 1, 1)), _act_block(sp, 16, 16, 3, "subm3"))
        self.conv_out = _act_block(sp, 16, 32, (3, 1, 1), "spconv_down2", "spconv", (2, 1, 1), 0)

    def forward(self, x):
        out = self.conv_out(self.layers(self.conv_input(x)))
        dense = out.dense()
        n, c, d, h, w = dense.shape
        return {"bev": dense.view(n, c * d, h, w)}


class PointceptSpUNet(nn.Module):
    """SpUNet: kernel-5 stem, PTv3-style SubM positional encoding added to the features, kernel-2 stride-2 down,
    kernel-2 inverse up with concat skip, and a kernel-1 SubM head with padding (spconv ignores it)."""

    def __init__(self, sp, cin):
        super().__init__()
        self.stem = sp.SparseSequential(sp.SubMConv3d(cin, 8, 5, padding=1, bias=False, indice_key="stem"),
                                        _norm(8), nn.ReLU())
        self.cpe = sp.SparseSequential(sp.SubMConv3d(8, 8, 3, bias=True, indice_key="cpe"), nn.Linear(8, 8),
                                       nn.LayerNorm(8))
        self.down = sp.SparseSequential(sp.SparseConv3d(8, 16, 2, stride=2, bias=False, indice_key="spconv1"),
                                        _norm(16), nn.ReLU())
        self.enc = _act_block(sp, 16, 16, 3, "subm1")
        self.up = sp.SparseSequential(sp.SparseInverseConv3d(16, 8, 2, indice_key="spconv1", bias=False),
                                      _norm(8), nn.ReLU())
        self.dec = _act_block(sp, 16, 8, 3, "subm0")
        self.final = sp.SubMConv3d(8, 4, kernel_size=1, padding=1, bias=True)

    def forward(self, x):
        x = self.stem(x)
        x = x.replace_feature(x.features + self.cpe(x).features)
        skip = x
        x = self.up(self.enc(self.down(x)))
        x = x.replace_feature(torch.cat((x.features, skip.features), dim=1))
        return {"seg": self.final(self.dec(x))}


class CenterPointResNet(nn.Module):
    """Residual SubM blocks (add through replace_feature), biased SubM convs, stride-2 downs, a (3,1,1) squeeze."""

    def __init__(self, sp, cin):
        super().__init__()
        self.sp = sp
        self.stem = sp.SparseSequential(sp.SubMConv3d(cin, 8, 3, bias=False, indice_key="res0"), _norm(8),
                                        nn.ReLU())
        self.b1a, self.b1b = self._pair(8, "res0")
        self.down = _act_block(sp, 8, 16, 3, None, "spconv", 2, 1)
        self.b2a, self.b2b = self._pair(16, "res1")
        self.out = sp.SparseSequential(sp.SparseConv3d(16, 16, (3, 1, 1), (2, 1, 1), bias=False), _norm(16),
                                       nn.ReLU())

    def _pair(self, c, key):
        a = self.sp.SparseSequential(self.sp.SubMConv3d(c, c, 3, padding=1, bias=True, indice_key=key), _norm(c),
                                     nn.ReLU())
        b = self.sp.SparseSequential(self.sp.SubMConv3d(c, c, 3, padding=1, bias=True, indice_key=key), _norm(c))
        return a, b

    @staticmethod
    def _residual(a, b, x):
        out = b(a(x))
        out = out.replace_feature(out.features + x.features)
        return out.replace_feature(torch.relu(out.features))

    def forward(self, x):
        x = self._residual(self.b1a, self.b1b, self.stem(x))
        x = self._residual(self.b2a, self.b2b, self.down(x))
        return {"bev": self.out(x).dense()}


class PoolsAndTransposed(nn.Module):
    """Max pool with an indice_key undone by an inverse conv, a voxel-counting conv, a transposed conv, ToDense."""

    def __init__(self, sp, cin):
        super().__init__()
        self.pool = sp.SparseMaxPool3d(2, 2, indice_key="mp")
        self.conv = sp.SubMConv3d(cin, 8, 3, bias=False, indice_key="s")
        self.unpool = sp.SparseInverseConv3d(8, 8, 2, indice_key="mp", bias=False)
        self.count = sp.SparseConv3d(8, 8, 3, 2, 1, bias=False, record_voxel_count=True)
        self.pool2 = sp.SparseMaxPool3d(3, 2, padding=1)
        self.trans = sp.SparseConvTranspose3d(8, 4, 2, 2, bias=False)
        self.dense = sp.ToDense()

    def forward(self, x):
        y = self.unpool(self.conv(self.pool(x)))
        p = self.pool2(self.count(y))
        return {"unpooled": y, "transposed": self.trans(p), "pooled_dense": self.dense(p)}


class Spconv1Checkpoint(nn.Module):
    """Layers whose weights a spconv 1.x (mmcv) checkpoint stores transposed; ``c`` has Cin == Cout == k, so its
    layout can't be told from the shape."""

    def __init__(self, sp):
        super().__init__()
        self.a = sp.SubMConv3d(3, 5, 3, indice_key="s")
        self.b = sp.SparseConv3d(5, 6, (3, 1, 1), 2, record_voxel_count=True, bias=False)
        self.c = sp.SubMConv3d(4, 4, 4, bias=False)
        self.bn = nn.BatchNorm1d(6)


def mmdet3d_style_load(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                        error_msgs):
    """What mmdetection3d installs as SparseModule._load_from_state_dict: runs the module's load pre-hooks, then
    copies each parameter and buffer, moving the last axis to the front when the checkpoint's metadata version of
    the module is not 2 (mmcv's spconv 1.x layout)."""
    version = local_metadata.get("version", None)
    for hook in self._load_state_dict_pre_hooks.values():
        hook(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)
    local = {k: v.data for k, v in list(self._parameters.items()) + list(self._buffers.items()) if v is not None}
    for name, param in local.items():
        key = prefix + name
        if key not in state_dict:
            if strict:
                missing_keys.append(key)
            continue
        value = state_dict[key]
        if version != 2:
            value = value.permute(value.dim() - 1, *range(value.dim() - 1))
        if value.shape != param.shape:
            error_msgs.append(f"size mismatch for {key}")
            continue
        param.copy_(value)
    if strict:
        for key in state_dict:
            if key.startswith(prefix):
                head = key[len(prefix):].split(".", 1)[0]
                if head not in self._modules and head not in local:
                    unexpected_keys.append(key)


def spconv1_state(model):
    """The model's weights as an mmcv spconv 1.x checkpoint: conv weights (*k, Cin, Cout), metadata version 1."""
    sd = model.state_dict()
    out = type(sd)()
    for k, v in sd.items():
        out[k] = v.permute(*range(1, v.dim()), 0).contiguous() if k.endswith("weight") and v.dim() > 2 else v
    out._metadata = {k: {"version": 1} for k in sd._metadata}
    return out


BUILDERS = {"pcdet_backbone8x": PcdetBackbone8x, "pcdet_unet": PcdetUNet, "mmdet3d_encoder": MmdetSparseEncoder,
            "pointcept_spunet": PointceptSpUNet, "centerpoint_resnet": CenterPointResNet,
            "pools_transposed": PoolsAndTransposed}


def make_input(sp, cin=4, shape=(17, 16, 16), batch_size=2, n_per_batch=200, dtype=torch.float64, seed=0):
    """A LiDAR-like input: distinct sites per batch entry, features from numpy's legacy generator (its stream is
    fixed across numpy versions, so both interpreters build the same tensor)."""
    import numpy as np
    rs = np.random.RandomState(seed)
    volume = int(np.prod(shape))
    rows = []
    for b in range(batch_size):
        flat = rs.choice(volume, n_per_batch, replace=False)
        rows.append(np.stack([np.full_like(flat, b), *np.unravel_index(flat, shape)], axis=1))
    indices = torch.from_numpy(np.concatenate(rows).astype(np.int32))
    features = torch.from_numpy(rs.uniform(-1, 1, size=(len(indices), cin))).to(dtype)
    return sp.SparseConvTensor(features, indices, list(shape), batch_size)


def deterministic_state(net, dtype=torch.float64):
    """Every parameter and float buffer from a fixed formula (no RNG): weights ~ +-1/sqrt(fan_in), BatchNorm
    running stats away from the identity so that they matter."""
    state = {}
    for i, (key, value) in enumerate(net.state_dict().items()):
        if not value.is_floating_point():
            state[key] = value.clone()
            continue
        n = value.numel()
        wave = torch.sin(torch.arange(n, dtype=torch.float64) * 0.7071 + 1.3 * i).reshape(value.shape)
        if key.endswith("running_var"):
            v = 1.0 + 0.5 * wave ** 2
        elif key.endswith("running_mean") or key.endswith("bias"):
            v = 0.2 * wave
        elif value.dim() == 1:  # norm weight
            v = 1.0 + 0.3 * wave
        else:
            v = wave / (n / value.shape[0]) ** 0.5
        state[key] = v.to(dtype)
    return state


def eval_mode(sp, net):
    """BatchNorm in eval, the sparse convs in train mode: spconv 2.3.8's CPU build refuses a bias in eval."""
    net.eval()
    for m in net.modules():
        if isinstance(m, sp.conv.SparseConvolution):
            m.train()
    return net


def output_arrays(sp, outputs):
    """Flat numpy arrays of a network's dict of outputs (sparse: features, indices, spatial_shape)."""
    arrays = {}
    for name, y in outputs.items():
        if isinstance(y, sp.SparseConvTensor):
            f = y.features.detach().cpu()
            arrays[f"{name}.features"] = (f.float() if f.dtype == torch.bfloat16 else f).numpy()
            arrays[f"{name}.indices"] = y.indices.cpu().numpy()
            arrays[f"{name}.spatial_shape"] = torch.tensor(list(y.spatial_shape)).numpy()
        else:
            d = y.detach().cpu()
            arrays[f"{name}.dense"] = (d.float() if d.dtype == torch.bfloat16 else d).numpy()
    return arrays


def _loss_weights(sp, y):
    """Fixed weights for a scalar loss over an output; a sparse output's depend on each row's coordinates, not on
    its position, since the row order of a strided conv's output is not promised."""
    if isinstance(y, sp.SparseConvTensor):
        idx = y.indices.to(torch.float64)
        site = (idx * torch.arange(1, idx.shape[1] + 1, dtype=torch.float64) * 0.37).sum(dim=1, keepdim=True)
        chan = torch.arange(y.features.shape[1], dtype=torch.float64) * 0.61
        return torch.sin(site + chan + 0.3)
    return torch.sin(torch.arange(y.numel(), dtype=torch.float64) * 0.013 + 0.3).reshape(y.shape)


def net_loss(sp, outputs):
    """A scalar over every output that carries a gradient, with _loss_weights (accumulated in FP64)."""
    values = [(y, y.features if isinstance(y, sp.SparseConvTensor) else y) for y in outputs.values()]
    return sum(v.double().mul(_loss_weights(sp, y)).sum() for y, v in values if v.requires_grad)


def build_net(sp, builders, name, dtype):
    """The named network with client_nets' fixed weights, BatchNorm in eval; a class with ``LOAD`` set to
    "mmdet3d_spconv1" gets them from an mmcv spconv 1.x checkpoint through mmdetection3d's load hook."""
    cls = builders[name]
    cin = getattr(cls, "INPUT", {}).get("cin", 4)
    net = cls(sp, cin)
    state = deterministic_state(net)
    if getattr(cls, "LOAD", None) == "mmdet3d_spconv1":
        src = cls(sp, cin)
        src.load_state_dict(state)
        saved = {k: sp.SparseModule.__dict__.get(k, None) for k in ("_version", "_load_from_state_dict")}
        sp.SparseModule._version = 2
        sp.SparseModule._load_from_state_dict = mmdet3d_style_load
        try:
            net.load_state_dict(spconv1_state(src), strict=True)
        finally:
            for k, v in saved.items():
                if v is None:
                    delattr(sp.SparseModule, k)
                else:
                    setattr(sp.SparseModule, k, v)
    else:
        net.load_state_dict(state)
    return eval_mode(sp, net.to(dtype))


def net_input(sp, builders, name, dtype):
    spec = dict(getattr(builders[name], "INPUT", {}))
    return make_input(sp, cin=spec.get("cin", 4), shape=spec.get("shape", (17, 16, 16)),
                      n_per_batch=spec.get("n", 200), dtype=dtype)


def run_net(sp, builders, name, dtype, backward=False, autocast_dtype=None):
    """Outputs (``output_arrays``) of one network and, with ``backward``, the gradients of a fixed scalar loss
    with respect to the input features ("input") and every parameter (by name). ``autocast_dtype`` runs the
    forward and the loss under torch.autocast on the CPU with FP32 weights."""
    net = build_net(sp, builders, name, dtype if autocast_dtype is None else torch.float32)
    x = net_input(sp, builders, name, dtype if autocast_dtype is None else torch.float32)
    x.features.requires_grad_(backward)
    with torch.autocast("cpu", dtype=autocast_dtype or torch.bfloat16, enabled=autocast_dtype is not None), \
            torch.set_grad_enabled(backward):
        out = net(x)
        loss = net_loss(sp, out)
    arrays = output_arrays(sp, out)
    if not backward:
        return arrays, {}
    loss.backward()
    grads = {"input": x.features.grad.detach().cpu().numpy()}
    grads.update({k: p.grad.detach().cpu().numpy() for k, p in net.named_parameters() if p.grad is not None})
    return arrays, grads
