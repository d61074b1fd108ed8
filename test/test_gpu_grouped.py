"""Grouped convolution on a real GPU: grouped layers through the fused route (table kernels) and the native GPU
route (gather, per-group GEMM, scatter) against the CPU route, FP32 to 1e-5 relative, FP16/BF16 against FP64
(no worse than twice the CPU route in the same dtype), bitwise run to run. Skips where no GPU (or no GPU
kernels) is present."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import constants
from support.reference import random_sparse

pytestmark = pytest.mark.gpu  # skipped without a GPU (conftest)


def rel(a, b):
    a, b = a.double().cpu(), b.double().cpu()
    return (torch.linalg.norm(a - b) / max(torch.linalg.norm(b).item(), 1e-30)).item()


def _net(seed=0):
    torch.manual_seed(seed)
    return spconv.SparseSequential(
        spconv.SubMConv3d(32, 32, 3, groups=32, indice_key="a"), torch.nn.ReLU(),
        spconv.SubMConv3d(32, 64, 3, groups=4, indice_key="a"),
        spconv.SparseConv3d(64, 64, 3, 2, 1, groups=8, indice_key="d"),
        spconv.SubMConv3d(64, 64, 1, groups=2),
        spconv.SparseInverseConv3d(64, 32, 3, indice_key="d", groups=32))


def _run(net, x, device, dtype):
    net = net.to(device, dtype)
    net.zero_grad()
    feats = x.features.to(device, dtype).detach().requires_grad_(True)  # a leaf, also where .to() is a no-op
    out = net(spconv.SparseConvTensor(feats, x.indices.to(device), x.spatial_shape, x.batch_size))
    g = torch.sin(torch.arange(out.features.numel(), dtype=torch.float64)).view_as(out.features)
    (out.features * g.to(device, dtype)).sum().backward()
    return [out.features.detach(), feats.grad] + [p.grad.clone() for p in net.parameters()]


@pytest.mark.parametrize("force_native", [False, True])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_grouped_net_matches_cpu(force_native, dtype, tol):
    x = random_sparse(3, [24, 24, 16], 2, 32, density=0.2, seed=1)
    ref_t = torch.float32 if dtype == torch.float32 else torch.float64
    want = _run(_net(), x, "cpu", ref_t)
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        got = _run(_net(), x, "cuda", dtype)
        again = _run(_net(), x, "cuda", dtype)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    # FP16/BF16: every layer rounds its output (and the ReLU's kinks amplify it), so the bound is the CPU
    # route's own error in the same dtype, doubled, where that exceeds tol.
    same = _run(_net(), x, "cpu", dtype) if dtype != ref_t else want
    assert len(got) == len(want) == len(same)
    for i, (a, b, c, s) in enumerate(zip(got, want, again, same)):
        assert a.dtype == dtype
        bound = max(tol, 2 * rel(s, b)) if dtype != ref_t else tol
        assert rel(a, b) < bound, "item %d: relative error %g, bound %g" % (i, rel(a, b), bound)
        assert torch.equal(a, c)  # deterministic
