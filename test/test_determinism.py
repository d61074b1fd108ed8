"""Determinism: forward and every gradient bitwise identical run to run and across thread counts (CPU), and
the switch (spconv.set_deterministic, torch.use_deterministic_algorithms) that reports it."""
import pytest
import torch

import spconv
import spconv.pytorch as spconv_pt
from support.nets import mixed_layers_net
from support.reference import random_sparse


def _run(net, x, threads):
    """Forward + backward on ``threads`` threads: output features, input grad and every parameter grad."""
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        net.zero_grad()
        feats = x.features.clone().requires_grad_()
        y = net(x.replace_feature(feats))
        g = torch.linspace(-1, 1, y.features.numel(), dtype=y.features.dtype,
                           device=y.features.device).reshape(y.features.shape)
        (y.features * g).sum().backward()
        return [y.features.detach().clone(), y.indices.clone(), feats.grad.clone()] + \
            [p.grad.clone() for p in net.parameters()]
    finally:
        torch.set_num_threads(saved)


# Sizes that cross the native route's chunk boundaries (many chunks per offset) and a case with
# few rows per offset (5-11), where MKL's multi-threaded GEMM splits small-M products differently.
CASES = {
    "many_rows": dict(shape=[40, 40, 20], density=0.2, c_in=4, c=16, batch=2, dtype=torch.float32),
    # Over 256k pairs in the first layer (C_in = 4, the direct route): the pairs are grouped by row in
    # parallel on 2 threads and serially on 1.
    "parallel_row_grouping": dict(shape=[64, 64, 32], density=0.2, c_in=4, c=16, batch=2, dtype=torch.float32),
    "few_rows_per_offset": dict(shape=[8, 8, 8], density=0.1, c_in=32, c=32, batch=1, dtype=torch.float32),
    "fp64": dict(shape=[16, 16, 8], density=0.3, c_in=3, c=8, batch=2, dtype=torch.float64),
    "bf16": dict(shape=[16, 16, 8], density=0.3, c_in=3, c=8, batch=2, dtype=torch.bfloat16),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_bitwise_across_runs_and_threads(case):
    p = CASES[case]
    x = random_sparse(3, p["shape"], p["batch"], p["c_in"], density=p["density"], dtype=p["dtype"], seed=1)
    torch.manual_seed(0)
    net = mixed_layers_net(p["c_in"], p["c"]).to(p["dtype"])
    ref = _run(net, x, 1)
    # 3 and 8 threads (more than the cores) split rows and map passes into more tasks than 2 do.
    for threads in (2, 1, 3, 8):
        got = _run(net, x, threads)
        for i, (a, b) in enumerate(zip(ref, got)):
            assert torch.equal(a, b), f"tensor {i} differs with {threads} threads"


@pytest.mark.parametrize("c_in,c_out", [(64, 64), (8, 96)])
def test_1x1_conv_bitwise_across_threads_and_matches_mm(c_in, c_out):
    # A 1x1 conv is a plain GEMM; the vendor GEMM's own threading changes dW's bits with the thread count on
    # some CPUs, so the CPU route runs it over the identity map in fixed blocks and split-K segments.
    x = random_sparse(3, [48, 48, 24], 1, c_in, density=0.5, seed=3)
    torch.manual_seed(0)
    net = spconv_pt.SparseSequential(spconv_pt.SubMConv3d(c_in, c_out, 1, bias=False))
    runs = [_run(net, x, t) for t in (1, 2, 1)]
    for got in runs[1:]:
        assert all(torch.equal(a, b) for a, b in zip(runs[0], got))
    w = net[0].weight.detach().view(c_in, c_out).double()
    f = x.features.double()
    assert torch.allclose(runs[0][0].double(), f @ w, rtol=1e-4, atol=1e-4)
    g = torch.linspace(-1, 1, runs[0][0].numel(), dtype=torch.float64).reshape(runs[0][0].shape)
    assert torch.allclose(runs[0][2].double(), g @ w.t(), rtol=1e-4, atol=1e-4)
    assert torch.allclose(runs[0][3].double().view(c_in, c_out), f.t() @ g, rtol=1e-4, atol=1e-3)


def test_bitwise_across_runs_with_batch_norm():
    x = random_sparse(3, [16, 16, 8], 2, 3, density=0.3, seed=1)
    torch.manual_seed(0)
    net = mixed_layers_net(3, 8, batch_norm=True)
    ref = _run(net, x, 2)
    assert all(torch.equal(a, b) for a, b in zip(ref, _run(net, x, 2)))


def test_set_deterministic_switch():
    assert not spconv.is_deterministic()
    spconv.set_deterministic(True)
    try:
        assert spconv.is_deterministic()
    finally:
        spconv.set_deterministic(False)
    assert not spconv.is_deterministic()
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        assert spconv.is_deterministic()
    finally:
        torch.use_deterministic_algorithms(saved)


def test_runs_under_torch_deterministic_algorithms():
    # Nothing in the CPU route is flagged nondeterministic by torch, and the bits match the default mode.
    p = CASES["fp64"]
    x = random_sparse(3, p["shape"], 2, 3, density=0.3, dtype=torch.float64, seed=2)
    torch.manual_seed(0)
    net = mixed_layers_net(3, 8, batch_norm=True).double()
    ref = _run(net, x, 2)
    saved = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    try:
        got = _run(net, x, 2)
    finally:
        torch.use_deterministic_algorithms(saved)
    assert all(torch.equal(a, b) for a, b in zip(ref, got))


@pytest.mark.gpu
@pytest.mark.parametrize("flag", [True, False], ids=["set_deterministic", "default"])
def test_gpu_bitwise_across_runs(flag):
    x = random_sparse(3, [40, 40, 20], 2, 4, density=0.2, seed=1)
    x = spconv_pt.SparseConvTensor(x.features.cuda(), x.indices.cuda(), x.spatial_shape, 2)
    torch.manual_seed(0)
    net = mixed_layers_net(4, 32, batch_norm=True).cuda()
    spconv.set_deterministic(flag)  # every GPU route is deterministic either way
    try:
        ref = _run(net, x, 1)
        for _ in range(3):
            assert all(torch.equal(a, b) for a, b in zip(ref, _run(net, x, 1)))
    finally:
        spconv.set_deterministic(False)
