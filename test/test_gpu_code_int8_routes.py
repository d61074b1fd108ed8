"""The int8 route policy of the GPU code, wherever it runs (``gpu_place``: the HIP CPU build, and a GPU when there
is one): SPCONV_FORCE_NATIVE moves quantized layers from the table kernel (``quantized_conv``) to gather -> vendor
int8 GEMM -> int32 scatter-add -> epilogue, as it moves the float ones; both give the CPU route's bits for every
conv kind, the 1x1 and linear layers, the add and activation epilogues and maps with duplicate coordinates. The
native route's epilogue in torch ops against the CPU kernel needs no GPU code (run with the HIP CPU cases)."""
import copy

import pytest
import torch

import spconv.pytorch as spconv
from spconv.benchmark.routes import forced_native
from spconv.benchmark.workloads.int8 import quantize_layer
from spconv.core import Activation
from spconv.pytorch import _int8, _route
from spconv.pytorch.quantization.core import quantize_per_tensor
from spconv.pytorch.quantization.quantized.conv import LinearPerChannelWeight


def _scene(g, shape, n, channels, duplicates=False):
    flat = torch.randperm(shape[0] * shape[1] * shape[2], generator=g)[:n]
    coords = torch.stack([flat // (shape[1] * shape[2]), flat // shape[2] % shape[1], flat % shape[2]], 1)
    if duplicates:  # a few coordinates twice (regular convs and pools sum / max over them)
        coords = torch.cat([coords, coords[:n // 5]])
    idx = torch.cat([torch.zeros(coords.shape[0], 1, dtype=torch.long), coords], 1).int()
    feats = torch.randn(idx.shape[0], channels, generator=g)
    x = spconv.SparseConvTensor(feats, idx, shape, 1)
    return x, quantize_per_tensor(x, float(feats.abs().max()) / 127, 0, torch.qint8)


def _int8_layer(conv, x):
    with torch.no_grad():
        out = conv(x)
    return quantize_layer(conv, float(out.features.abs().max()) / 100 + 1e-8)


def _at(place, x):
    """A qint8 tensor, or a SparseConvTensor with qint8 features, at the place: the same int8 values and scale."""
    if isinstance(x, spconv.SparseConvTensor):
        return spconv.SparseConvTensor(_at(place, x.features), place.to(x.indices), x.spatial_shape, x.batch_size)
    return _int8.as_qint8(place.to(_int8.int_view(x)), x.q_scale())


def _three_routes(place, fn, layers, inputs):
    """(cpu, fused, native) results of ``fn(*layers, *inputs)`` and the op counts of the two GPU-code runs, which
    take the inputs at the place and copies of the layers made before the CPU's run (an int8 conv keeps the filters
    of its first run, on that run's device)."""
    dev_layers, dev_inputs = copy.deepcopy(layers), [_at(place, x) for x in inputs]
    with torch.no_grad():
        cpu = fn(*layers, *inputs)
        runs, names = [], []
        for native in (False, True):
            with place.active(), forced_native(native):
                assert _route.int8_route(place.device) == ("native" if native else "fused")
                with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
                    runs.append(fn(*dev_layers, *dev_inputs))
            names.append([e.name for e in prof.events()])
    return cpu, runs[0], runs[1], names


def _same_bits(a, b):
    """a (the CPU's) and b (the GPU code's, wherever it ran): the same int8 values and scale."""
    a = a.features if isinstance(a, spconv.SparseConvTensor) else a
    b = b.features if isinstance(b, spconv.SparseConvTensor) else b
    assert a.dtype == b.dtype == torch.qint8 and a.q_scale() == b.q_scale()
    assert torch.equal(_int8.int_view(a), _int8.int_view(b).cpu())


KINDS = {
    "subm3": lambda: spconv.SubMConv3d(5, 12, 3, indice_key="s"),
    "conv_s2": lambda: spconv.SparseConv3d(5, 12, 3, stride=2, padding=1),
    "conv_k2s2": lambda: spconv.SparseConv3d(5, 12, 2, stride=2),
    "transposed": lambda: spconv.SparseConvTranspose3d(5, 12, 3, stride=2),
    "subm_1x1": lambda: spconv.SubMConv3d(5, 12, 1),
    "dilated": lambda: spconv.SubMConv3d(5, 12, 3, dilation=2),
}


@pytest.mark.parametrize("duplicates", [False, True])
@pytest.mark.parametrize("kind", sorted(KINDS))
def test_native_and_fused_give_the_cpu_bits(gpu_place, kind, duplicates):
    torch.manual_seed(len(kind))
    conv = KINDS[kind]()
    if duplicates and conv.subm:
        pytest.skip("submanifold maps refuse duplicate coordinates on every route")
    g = torch.Generator().manual_seed(len(kind) + 7 * duplicates)
    xf, xq = _scene(g, [7, 9, 8], 120, 5, duplicates)
    q = _int8_layer(conv, xf)
    cpu, fused, native, names = _three_routes(gpu_place, lambda layer, x: layer(x), [q], [xq])
    _same_bits(cpu, fused)
    _same_bits(cpu, native)
    assert names[0].count(gpu_place.ops.name + "::quantized_conv") == 1
    assert names[1].count(gpu_place.ops.name + "::quantized_conv") == 0 and "aten::_int_mm" in names[1]


def test_inverse_conv_and_epilogues(gpu_place):
    """conv-add-ReLU (residual in the epilogue), LeakyReLU and an inverse conv over a strided conv's map."""
    g = torch.Generator().manual_seed(3)
    torch.manual_seed(3)
    xf, xq = _scene(g, [8, 8, 8], 150, 6)
    down = _int8_layer(spconv.SparseConv3d(6, 6, 3, stride=2, padding=1, indice_key="d"), xf)
    up_f = spconv.SparseInverseConv3d(6, 6, 3, indice_key="d")
    with torch.no_grad():
        up = _int8_layer(up_f, spconv.SparseSequential(spconv.SparseConv3d(6, 6, 3, 2, 1, indice_key="d"))(xf))

    def run(down, up, xq):
        h = down(xq)
        a = up._conv_forward(False, h, up._weight, up._bias / up.scale, add_input=xq,
                             channel_scale=h.q_scale() * _int8.weight_scales(up._weight) / up.scale,
                             output_scale=up.scale, act_type=Activation.ReLU)
        b = down._conv_forward(False, xq, down._weight, down._bias / down.scale,
                               channel_scale=xq.q_scale() * _int8.weight_scales(down._weight) / down.scale,
                               output_scale=down.scale, act_type=Activation.LeakyReLU, act_alpha=0.125)
        return a, b

    cpu, fused, native, _ = _three_routes(gpu_place, run, [down, up], [xq])
    for i in range(2):
        _same_bits(cpu[i], fused[i])
        _same_bits(cpu[i], native[i])
    assert int((_int8.int_view(cpu[1].features) < 0).sum()) > 0  # LeakyReLU kept negative values


def test_linear_layer(gpu_place):
    g = torch.Generator().manual_seed(4)
    lin = torch.nn.Linear(19, 10)
    w = lin.weight.detach()
    ws = (w.abs().amax(1) / 127).double()
    q = LinearPerChannelWeight(19, 10)
    q.set_weight_bias(torch.quantize_per_channel(w, ws, torch.zeros(10, dtype=torch.long), 0, torch.qint8),
                      lin.bias)
    q.scale = 0.05
    x = torch.quantize_per_tensor(torch.randn(33, 19, generator=g), 0.03, 0, torch.qint8)
    cpu, fused, native, _ = _three_routes(gpu_place, lambda layer, x: layer(x), [q], [x])
    assert torch.equal(cpu.int_repr(), fused.int_repr().cpu())
    assert torch.equal(cpu.int_repr(), native.int_repr().cpu())


@pytest.mark.hip_cpu  # no GPU code: run with this file's HIP CPU cases, as before
def test_epilogue_matches_the_kernel_on_special_values():
    """The native route's torch-op epilogue against the CPU kernel on sums that round to ties, saturate, and
    meet inf / NaN scales (no GPU code needed: both run here)."""
    g = torch.Generator().manual_seed(9)
    n, cin, cout = 40, 8, 11
    x = torch.randint(-128, 128, (n, cin), generator=g).to(torch.int8)
    w = torch.randint(-128, 128, (1, cin, cout), generator=g).to(torch.int8)
    scale = torch.tensor([0.5, 1e-3, 0.25, 1.0, 7.0, float("inf"), float("nan"), 2 ** -7, 3e-4, 0.0, 1e-2])
    bias = torch.tensor([0.5, -0.5, 1.5, 0.0, -2.5, 0.0, 1.0, 0.25, 127.5, -128.5, 0.0])
    res = torch.randint(-128, 128, (n, cout), generator=g).to(torch.int8)
    nbr = _int8.identity_table(n, x.device)
    for act, alpha in ((0, 0.0), (1, 0.0), (2, 0.1)):
        for b, r in ((None, None), (bias, None), (bias, res)):
            want = torch.ops.spconv.quantized_conv(x, w, nbr, scale, b, r, 0.375, act, alpha)
            got = _int8.epilogue(_int8.int_mm(x, w[0]), scale, b, r, 0.375, act, alpha)
            assert torch.equal(want, got), (act, b is None, r is None)
