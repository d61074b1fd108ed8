"""Edge sizes: empty tensors through whole networks, grids beyond 2^31 sites, N x C beyond 2^31 elements,
and flat memory over many iterations."""
import gc
import os

import numpy as np
import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from support.reference import brute_force, random_sparse

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _unet(c=2):
    """Every layer kind, two resolutions down and back (max-pool and conv inverted through their keys)."""
    return spconv.SparseSequential(
        spconv.SubMConv3d(c, 4, 3, indice_key="s0"), nn.BatchNorm1d(4), nn.ReLU(),
        spconv.SparseConv3d(4, 4, 3, 2, 1, indice_key="down"), spconv.SparseBatchNorm(4), spconv.SparseReLU(),
        spconv.SubMConv3d(4, 4, 3, indice_key="s1"), spconv.SubMConv3d(4, 4, 1),
        spconv.SparseMaxPool3d(2, 2, indice_key="pool"),
        spconv.SparseAvgPool3d(1, 1),
        spconv.SparseInverseConv3d(4, 4, 2, indice_key="pool"),
        spconv.SparseInverseConv3d(4, 3, 3, indice_key="down"),
        spconv.SparseConvTranspose3d(3, c, 3, 1, 1),
    )


@pytest.mark.parametrize("device", DEVICES)
def test_empty_input_through_network(device):
    torch.manual_seed(0)
    net = _unet().to(device)
    feats = torch.zeros(0, 2, device=device, requires_grad=True)
    x = spconv.SparseConvTensor(feats, torch.zeros(0, 4, dtype=torch.int32, device=device), [8, 9, 10], 2)
    y = net(x)
    assert y.features.shape == (0, 2) and y.indices.shape == (0, 4)
    assert y.spatial_shape == [8, 9, 10]
    d = y.dense()
    assert d.shape == (2, 2, 8, 9, 10) and not d.any()
    (y.features.sum() + d.sum()).backward()
    assert feats.grad.shape == (0, 2)
    for name, p in net.named_parameters():
        assert p.grad is None or not p.grad.any(), name


@pytest.mark.parametrize("device", DEVICES)
def test_layer_with_no_active_output(device):
    # Coordinate 4 with kernel 2, stride 2 on a size-5 axis reaches no output: everything after is empty.
    idx = torch.tensor([[0, 4, 4, 4], [1, 4, 0, 4]], dtype=torch.int32, device=device)
    feats = torch.randn(2, 2, device=device, requires_grad=True)
    x = spconv.SparseConvTensor(feats, idx, [5, 5, 5], 2)
    torch.manual_seed(0)
    net = spconv.SparseSequential(
        spconv.SubMConv3d(2, 4, 3, indice_key="a"), spconv.SparseConv3d(4, 4, 2, 2, indice_key="down"),
        nn.BatchNorm1d(4), spconv.SubMConv3d(4, 4, 3), spconv.SparseConv3d(4, 4, 2, 2),
        spconv.SparseGlobalMaxPool()).to(device)
    y = net[:2](x)
    assert y.features.shape == (0, 4) and y.spatial_shape == [2, 2, 2]
    z = net(x)
    assert z.shape == (2, 4) and not z.any()
    # Back up through the stored map: the inverse conv restores the two input sites, all-bias.
    up = spconv.SparseInverseConv3d(4, 2, 2, indice_key="down").to(device)
    w = up(net[:2](x))
    assert torch.equal(w.indices, idx)
    (w.features.sum() + z.sum()).backward()
    assert feats.grad.shape == (2, 2)
    torch.testing.assert_close(w.features, up.bias.expand(2, 2).detach())


@pytest.mark.parametrize("shape", [[2 ** 21, 2 ** 21, 64], [2 ** 16, 2 ** 16, 2 ** 12, 8]])
def test_grid_beyond_2_31_sites(shape):
    """Batch x volume ~2^49: keys are int64. Sites 2^32 apart in key space would collide in 32 bits."""
    nd = len(shape)
    g = torch.Generator().manual_seed(0)
    # A cluster near the far corner, plus copies shifted so their keys equal the originals mod 2^32.
    base = torch.tensor(shape) - 6
    pts = base + torch.randint(0, 5, (40, nd), generator=g)
    key_stride = [int(np.prod(shape[d + 1:])) for d in range(nd)]
    d_alias = next(d for d in range(nd) if key_stride[d] <= 2 ** 32 and 2 ** 32 % key_stride[d] == 0)
    alias = pts.clone()
    alias[:, d_alias] -= 2 ** 32 // key_stride[d_alias]
    coords = torch.cat([pts, alias, pts])
    batch = torch.cat([torch.zeros(80, dtype=torch.long), torch.ones(40, dtype=torch.long)])
    idx = torch.cat([batch[:, None], coords], 1)
    idx = torch.unique(idx, dim=0).int()
    x = spconv.SparseConvTensor(torch.randn(idx.shape[0], 3, generator=g, dtype=torch.float64), idx, shape, 2)
    torch.manual_seed(0)
    conv_cls = {3: (spconv.SubMConv3d, spconv.SparseConv3d), 4: (spconv.SubMConv4d, spconv.SparseConv4d)}[nd]
    subm = conv_cls[0](3, 4, 3, bias=False).double()
    down = conv_cls[1](3, 4, 3, 2, 1, bias=False, indice_key="down").double()
    y = subm(x)
    ref = brute_force("subm", x, subm.weight.detach(), y.indices, y.spatial_shape, [1] * nd, [0] * nd, [1] * nd)
    torch.testing.assert_close(y.features, ref, atol=1e-10, rtol=1e-10)
    z = down(x)
    ref = brute_force("conv", x, down.weight.detach(), z.indices, z.spatial_shape, down.stride, down.padding,
                      down.dilation)
    torch.testing.assert_close(z.features, ref, atol=1e-10, rtol=1e-10)
    up = {3: spconv.SparseInverseConv3d, 4: spconv.SparseInverseConv4d}[nd](4, 3, 3, indice_key="down").double()
    assert torch.equal(up(z).indices, idx)


def test_grid_beyond_2_63_sites_rejected():
    idx = torch.tensor([[0, 5, 5, 5], [3, 2 ** 30 - 1, 2 ** 30 - 1, 2 ** 30 - 1]], dtype=torch.int32)
    x = spconv.SparseConvTensor(torch.randn(2, 2), idx, [2 ** 30] * 3, 4)
    with pytest.raises(ValueError, match="more than 2\\^63 sites"):
        spconv.SubMConv3d(2, 2, 3)(x)


def test_rows_times_channels_beyond_2_31():
    """Gather offsets row * C computed in int64: read rows past element 2^31 of a [N, C] feature tensor.

    The tensor is 8.6 GB virtually, but only the rows we write are ever touched, so it costs a few pages.
    """
    c = 4
    n = 2 ** 31 // c + 64
    try:
        feats = torch.empty(n, c)
    except RuntimeError as e:  # pragma: no cover - allocation refused by the OS
        pytest.skip(f"can't reserve {n * c * 4 / 2 ** 30:.1f} GiB of address space: {e}")
    rows = torch.tensor([n - 1, n - 40, 2 ** 29 + 1, 5], dtype=torch.int32)
    vals = torch.randn(4, c)
    feats[rows.long()] = vals
    w = torch.randn(2, c, 3)  # two offsets
    pair_in = torch.cat([rows, rows[:2]])
    pair_out = torch.tensor([0, 1, 2, 3, 1, 0], dtype=torch.int32)
    pair_offsets = torch.tensor([0, 4, 6], dtype=torch.int64)
    out = torch.ops.spconv.indice_conv(feats, w, pair_in, pair_out, pair_offsets, 4)
    ref = vals @ w[0]
    ref[1] += vals[0] @ w[1]
    ref[0] += vals[1] @ w[1]
    torch.testing.assert_close(out, ref)
    del feats


def _rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="RSS read from /proc")
def test_memory_flat_over_1000_iterations():
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(2, 4, 3, indice_key="a"), spconv.SparseConv3d(4, 4, 2, 2,
                                  indice_key="d"), spconv.SparseMaxPool3d(1, 1), spconv.SparseInverseConv3d(4, 2, 2,
                                  indice_key="d"))
    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
    xs = [random_sparse(3, [6, 6, 6], 2, 2, density=0.05, seed=s) for s in range(4)]

    def step(i):
        x = xs[i % 4]
        x = x.replace_feature(x.features.clone().requires_grad_())
        opt.zero_grad()
        y = net(x)
        (y.features.square().sum() + y.dense().sum()).backward()
        opt.step()

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a leak doesn't need threads; tiny OpenMP regions crawl on a loaded machine
    try:
        for i in range(100):
            step(i)
        gc.collect()
        before = _rss_bytes()
        for i in range(1000):
            step(i)
        gc.collect()
        grown = _rss_bytes() - before
    finally:
        torch.set_num_threads(threads)
    assert grown < 8 * 2 ** 20, f"RSS grew by {grown / 2 ** 20:.1f} MiB over 1000 iterations"


@pytest.mark.gpu
def test_gpu_memory_flat_over_1000_iterations():
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(2, 4, 3), spconv.SparseConv3d(4, 4, 2, 2)).cuda()
    x = random_sparse(3, [6, 6, 6], 2, 2, density=0.05)
    x = spconv.SparseConvTensor(x.features.cuda(), x.indices.cuda(), x.spatial_shape, 2)
    for i in range(1100):
        if i == 100:
            torch.cuda.synchronize()
            before = torch.cuda.memory_allocated()
        net(x).features.sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before <= 4096
