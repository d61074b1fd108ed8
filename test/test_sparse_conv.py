"""The accuracy suite: SubM and regular sparse convolutions through the public modules (SubMConv3d,
SparseConv3d) against the dense ``F.conv3d`` of the densified tensor, forward, dinput and dfilter.

Runs where the code runs: ``cpu`` (the native C++ route), ``hip_cpu`` (the GPU glue and kernels executed on the
CPU by the HIP CPU runtime) and ``cuda`` (a CUDA or ROCm GPU; skipped without one), each on both routes: ``fused``
(gather-GEMM-scatter in one kernel, the default) and ``native`` (gather -> GEMM -> scatter,
``SPCONV_FORCE_NATIVE``). FP32 must match the FP64 reference to ``allclose(atol=1e-4, rtol=1e-4)``; FP16 and BF16
must meet ``norm(diff) < 10 * max(1, max(Cin, Cout) / 16)`` against the FP32 reference and a relative bound
against FP64.

    python3 -m pytest test/test_sparse_conv.py -v                # every device this machine has
    python3 -m pytest test/test_sparse_conv.py -v -k cuda        # on the GPU only
"""
import contextlib

import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from support.reference import dense_reference, low_precision_ok, random_sparse
from conftest import hip_cpu_library

SHAPE = [9, 8, 7]
BATCH = 2
# (kind, kernel, stride, padding, dilation): the SubM and regular layers of a LiDAR backbone.
LAYERS = {
    "subm3": ("subm", 3, 1, 0, 1),
    "subm3-d2": ("subm", 3, 1, 0, 2),
    "conv3-s2": ("conv", 3, 2, 1, 1),
    "conv2-s2": ("conv", 2, 2, 0, 1),
}
CHANNELS = [(16, 32), (3, 5)]  # tensor-core friendly, and odd (edge tiles, SIMT)
# Relative L2 error against FP64 allowed in 16-bit (inputs rounded first, so this measures the arithmetic; seen:
# at most 4e-4 in FP16, 2.5e-3 in BF16).
REL_FP64 = {torch.float16: 2e-3, torch.bfloat16: 1e-2}

DEVICES = [
    "cpu",
    pytest.param("hip_cpu", marks=[pytest.mark.hip_cpu, pytest.mark.slow]),  # every GPU thread a fiber: seconds a case
    pytest.param("cuda", marks=pytest.mark.gpu),  # skipped without a GPU (conftest); hip_cpu runs the same code
]


@contextlib.contextmanager
def placed(device: str, route: str, monkeypatch):
    """(tensor device, context) of one place and route."""
    monkeypatch.setattr(constants, "SPCONV_FORCE_NATIVE", route == "native")
    if device == "hip_cpu":
        with _backend.gpu_code_on_cpu(hip_cpu_library("simt").name):
            yield torch.device("cpu")
    else:
        yield torch.device(device)


def _layer(name: str, cin: int, cout: int, dtype, device):
    kind, k, s, p, d = LAYERS[name]
    if kind == "subm":
        layer = spconv.SubMConv3d(cin, cout, k, dilation=d, bias=True)
    else:
        layer = spconv.SparseConv3d(cin, cout, k, s, p, d, bias=True)
    return layer.to(device=device, dtype=dtype)


def _run(layer, x, grad):
    """Output tensor, dinput, dweight, dbias of one forward and backward."""
    feats = x.features.detach().clone().requires_grad_(True)
    out = layer(spconv.SparseConvTensor(feats, x.indices, x.spatial_shape, x.batch_size))
    layer.zero_grad()
    (out.features * grad.to(out.features.dtype)).sum().backward()
    return out, feats.grad, layer.weight.grad, layer.bias.grad


def _dense(name: str, x, weight, bias, out, grad):
    """The dense reference in the dtype of its inputs: output features at ``out``'s sites and the gradients."""
    kind, k, s, p, d = LAYERS[name]
    feats = x.features.detach().clone().requires_grad_(True)
    w = weight.detach().clone().requires_grad_(True)
    b = bias.detach().clone().requires_grad_(True)
    xr = spconv.SparseConvTensor(feats, x.indices.cpu(), x.spatial_shape, x.batch_size)
    y = dense_reference(kind, xr, w, out.indices.cpu(), out.spatial_shape, [s] * 3, [p] * 3, [d] * 3, b)
    (y * grad).sum().backward()
    return y.detach(), feats.grad, w.grad, b.grad


@pytest.mark.parametrize("route", ["fused", "native"])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("cin, cout", CHANNELS, ids=lambda v: str(v))
@pytest.mark.parametrize("name", sorted(LAYERS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
def test_conv_against_dense(name, cin, cout, device, route, dtype, monkeypatch):
    torch.manual_seed(0)
    x64 = random_sparse(3, SHAPE, BATCH, cin, density=0.15, dtype=torch.float64, seed=1)
    layer = _layer(name, cin, cout, torch.float64, "cpu")
    # The inputs rounded to the layer's dtype once: the references then measure the arithmetic alone.
    feats = x64.features.to(dtype)
    weight, bias = layer.weight.detach().to(dtype), layer.bias.detach().to(dtype)
    with placed(device, route, monkeypatch) as dev:
        run_layer = _layer(name, cin, cout, dtype, dev)
        with torch.no_grad():
            run_layer.weight.copy_(weight.to(dev))
            run_layer.bias.copy_(bias.to(dev))
        x = spconv.SparseConvTensor(feats.to(dev), x64.indices.to(dev), SHAPE, BATCH)
        probe = run_layer(x)  # the output sites, to draw the output gradient
        grad = torch.randn(probe.features.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
        out, dx, dw, db = _run(run_layer, x, grad.to(dev))
    mine = [t.detach().cpu() for t in (out.features, dx, dw, db)]
    assert out.indices.shape[0] > 0 and mine[1].abs().sum() > 0  # the case exercises the layer
    x_ref = spconv.SparseConvTensor(feats.double(), x64.indices, SHAPE, BATCH)
    ref64 = _dense(name, x_ref, weight.double(), bias.double(), out, grad)
    what = ["forward", "dinput", "dweight", "dbias"]
    if dtype == torch.float32:
        for w, a, r in zip(what, mine, ref64):
            torch.testing.assert_close(a.double(), r, atol=1e-4, rtol=1e-4, msg=lambda m: f"{w}: {m}")
        return
    x32 = spconv.SparseConvTensor(feats.float(), x64.indices, SHAPE, BATCH)
    ref32 = _dense(name, x32, weight.float(), bias.float(), out, grad.float())
    for w, a, r32, r64 in zip(what, mine, ref32, ref64):
        assert low_precision_ok(a.float() - r32, cin, cout), (w, float((a.float() - r32).norm()))
        rel = float((a.double() - r64).norm() / r64.norm().clamp_min(1e-30))
        assert rel < REL_FP64[dtype], (w, rel)
