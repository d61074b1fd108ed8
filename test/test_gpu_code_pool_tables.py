"""The pooling layers' GPU route over the kernel map's neighbour tables (spconv/pytorch/_pool_table.py), wherever
the GPU code runs (``gpu_place``: the HIP CPU build, and a GPU when there is one): bit for bit the CPU route's
results (forward, count, gradient; ties, clamped windows, FP16/BF16/FP64, 1D-4D, submanifold maps), tables made
once per map, maps without tables or with repeated rows, empty inputs, the table ops' checks and opcheck. Only on
the HIP CPU build (its launch ledger counts the launches): one launch forward and one backward on a map whose
tables exist, no host wait."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend
from spconv.benchmark.launch_ledger import Ledger
from spconv.pytorch import ops as sp_ops
from spconv.pytorch.core import PairMaps
from support.places import Place
from support.sites import random_coords
from support.sites import coords

_SHAPE = {1: [40], 2: [12, 11], 3: [9, 8, 7], 4: [5, 6, 4, 5]}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16]


def kernel_map(place, nd, n=150, ksize=3, stride=2, padding=1, subm=False, seed=0, idx=None):
    """(indices on the CPU, out indices, map) of a pooling layer's kernel map, built by the GPU code at the
    place."""
    shape = _SHAPE[nd]
    idx = random_coords(shape, 2, n, seed) if idx is None else idx
    k, s, p, d = [ksize] * nd, [1 if subm else stride] * nd, [padding] * nd, [1] * nd
    out_shape = shape if subm else sp_ops.get_conv_output_size(shape, k, s, p, d)
    with place.active():
        out, maps = sp_ops.build_kernel_map(place.to(idx), 2, shape, out_shape, k, s, p, d, subm, False)
    return idx, out, maps


def features(n, c, dtype, seed=1):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, c, generator=g)
    x[::3] = torch.round(x[::3] * 2) / 2  # ties
    x[1::4] = -x[1::4].abs() - 0.25  # clamped windows
    x[2::7] = 0.0
    return x.to(dtype)


def pool(place, maximum, x, maps, num_out, dy):
    """(out, dx) of the pool on the GPU route (through the layers' entry point), on the CPU; x and dy on the
    CPU."""
    x = place.to(x).detach().clone().requires_grad_(True)  # a leaf at the place
    with place.active():
        y = (sp_ops.indice_maxpool_native if maximum else lambda *a: sp_ops.indice_avgpool_native(*a)[0])(
            x, maps, num_out)
        y.backward(place.to(dy))
    return y.detach().cpu(), x.grad.cpu()


def cpu_pool(maximum, x, maps, num_out, dy):
    """The CPU route on the same pairs."""
    ops = torch.ops.spconv
    args = (maps.pair_in.cpu(), maps.pair_out.cpu(), maps.pair_offsets.cpu())
    if maximum:
        y = ops.indice_maxpool(x, *args, num_out)
        return y, ops.indice_maxpool_backward(x, y, dy, *args)
    y, count = ops.indice_avgpool(x, *args, num_out)
    return y, ops.indice_avgpool_backward(dy, count, *args, x.shape[0])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("nd", [1, 2, 3, 4])
@pytest.mark.parametrize("maximum", [True, False], ids=["max", "avg"])
def test_layers_route_matches_cpu_bitwise(gpu_place, nd, dtype, maximum):
    idx, out, maps = kernel_map(gpu_place, nd, seed=nd)
    x = features(idx.shape[0], 6, dtype, seed=nd)
    dy = torch.randn(out.shape[0], 6, generator=torch.Generator().manual_seed(7)).to(dtype)
    y, dx = pool(gpu_place, maximum, x, maps, out.shape[0], dy)
    yc, dxc = cpu_pool(maximum, x, maps, out.shape[0], dy)
    assert y.dtype == dx.dtype == dtype
    assert torch.equal(y, yc) and torch.equal(dx, dxc)
    assert "pool_out_table" in maps.cache and "pool_in_table" in maps.cache  # the table route ran


@pytest.mark.parametrize("maximum", [True, False], ids=["max", "avg"])
def test_submanifold_pool_never_reads_the_pairs(gpu_place, maximum):
    """A submanifold map built on the device has no pairs until something needs them: the table route doesn't."""
    idx, out, maps = kernel_map(gpu_place, 3, n=120, ksize=3, subm=True, seed=3)
    x = features(idx.shape[0], 5, torch.float32)
    dy = torch.randn(out.shape[0], 5, generator=torch.Generator().manual_seed(2))
    y, dx = pool(gpu_place, maximum, x, maps, out.shape[0], dy)
    assert not maps.resolved
    with gpu_place.active():
        maps.pair_in  # the reference reads the pairs: made by the GPU code's one host read
    yc, dxc = cpu_pool(maximum, x, maps, out.shape[0], dy)
    assert torch.equal(y, yc) and torch.equal(dx, dxc)


# The HIP CPU build alone: its launch ledger counts the project's launches.
@pytest.mark.parametrize("maximum", [True, False], ids=["max", "avg"])
def test_one_launch_each_way_on_a_cached_map(hip_cpu, maximum):
    """The ledger's pool_cached row: 1 launch forward, 1 backward (ours + ATen), no host wait. The map's builder
    wrote both tables, so the first pool on it is one launch too; on a map that lacks its out->in table the first
    pool makes it once (one fill and one transpose), never again."""
    idx, out, maps = kernel_map(Place("hip_cpu", hip_cpu), 3, n=300, ksize=2, stride=2, padding=0, seed=5)
    x = features(idx.shape[0], 8, torch.float32).requires_grad_(True)
    fn = sp_ops.indice_maxpool_native if maximum else lambda *a: sp_ops.indice_avgpool_native(*a)[0]
    ledger = Ledger(hip_cpu)
    with _backend.gpu_code_on_cpu(hip_cpu.name):
        assert maps.out_table is not None and maps.in_table is not None
        first, _, _ = ledger.count(lambda: fn(x, maps, out.shape[0]))
        assert (first.total_launches, first.host_waits) == (1, 0)
        _, _, bare = kernel_map(Place("hip_cpu", hip_cpu), 3, n=300, ksize=2, stride=2, padding=0, seed=5)
        bare.out_table = None
        made, _, _ = ledger.count(lambda: fn(x, bare, out.shape[0]))
        assert (made.total_launches, made.host_waits) == (3, 0)  # the out table: fill + transpose; the pool
        again, _, _ = ledger.count(lambda: fn(x, bare, out.shape[0]))
        assert (again.total_launches, again.host_waits) == (1, 0)
        fwd, _, y = ledger.count(lambda: fn(x, maps, out.shape[0]))
        g = torch.ones_like(y)
        bwd, _, _ = ledger.count(lambda: y.backward(g))
        with torch.no_grad():
            infer, _, _ = ledger.count(lambda: fn(x, maps, out.shape[0]))
    for t in (fwd, bwd, infer):
        assert (t.launches, t.aten_launches, t.host_waits) == (1, 0, 0), t


def test_layer_on_the_gpu_route_matches_cpu(gpu_place):
    """SparseMaxPool / SparseAvgPool modules, FP16, forward and backward, against the CPU route."""
    idx = random_coords(_SHAPE[3], 2, 200, 9)
    feats = features(idx.shape[0], 8, torch.float16)
    for layer in (spconv.SparseMaxPool3d(3, 2, 1), spconv.SparseAvgPool3d(2, 2)):
        res = []
        for gpu in (False, True):
            on = gpu_place.to if gpu else (lambda t: t)
            x = on(feats).detach().clone().requires_grad_(True)
            st = spconv.SparseConvTensor(x, on(idx), _SHAPE[3], 2)
            if gpu:
                with gpu_place.active():
                    y = layer(st)
            else:
                y = layer(st)
            yi = y.indices.cpu()
            order = torch.argsort(yi[:, 0].long() * 10 ** 6 + yi[:, 1].long() * 10 ** 4 + yi[:, 2].long() * 100 +
                                  yi[:, 3].long())
            g = torch.sin(torch.arange(order.numel(), dtype=torch.float32))[:, None].to(torch.float16)
            grad = torch.empty(y.features.shape, dtype=y.features.dtype)
            grad[order] = g.expand(-1, 8)
            y.features.backward(on(grad))
            res.append((y.features.detach().cpu()[order], x.grad.cpu()))
        assert torch.equal(res[0][0], res[1][0]) and torch.equal(res[0][1], res[1][1]), type(layer).__name__


def test_empty_input(gpu_place):
    idx = gpu_place.to(torch.zeros(0, 4, dtype=torch.int32))
    for layer in (spconv.SparseMaxPool3d(2, 2), spconv.SparseAvgPool3d(2, 2)):
        x = torch.zeros(0, 3, device=gpu_place.device, requires_grad=True)
        with gpu_place.active():
            y = layer(spconv.SparseConvTensor(x, idx, _SHAPE[3], 1))
            y.features.sum().backward()
        assert y.features.shape == (0, 3) and x.grad.shape == (0, 3)


def test_map_without_tables_builds_them_once(gpu_place):
    """A map made from pairs by hand (no builder tables, no host record): tables built at the first pool, checked
    on the device, cached; the results are the CPU route's."""
    idx, out, built = kernel_map(gpu_place, 2, seed=4)
    maps = PairMaps(built.pair_in, built.pair_out, built.pair_offsets, idx.shape[0], out.shape[0])
    x = features(idx.shape[0], 4, torch.float32)
    dy = torch.randn(out.shape[0], 4, generator=torch.Generator().manual_seed(3))
    y, dx = pool(gpu_place, True, x, maps, out.shape[0], dy)
    yc, dxc = cpu_pool(True, x, maps, out.shape[0], dy)
    assert torch.equal(y, yc) and torch.equal(dx, dxc)
    tables = maps.cache["pool_out_table"], maps.cache["pool_in_table"]
    y2, dx2 = pool(gpu_place, True, x, maps, out.shape[0], dy)
    assert maps.cache["pool_out_table"] is tables[0] and maps.cache["pool_in_table"] is tables[1]
    assert torch.equal(y2, y) and torch.equal(dx2, dx)


def test_duplicate_coordinates_keep_the_pair_route(gpu_place):
    """Repeated input coordinates repeat an output at one offset: no table holds that; the CPU route pools."""
    idx = coords(_SHAPE[2], 2, 80, seed=6, dups=15)
    _, out, maps = kernel_map(gpu_place, 2, idx=idx)
    x = features(idx.shape[0], 3, torch.float32)
    dy = torch.randn(out.shape[0], 3, generator=torch.Generator().manual_seed(5))
    for maximum in (True, False):
        y, dx = pool(gpu_place, maximum, x, maps, out.shape[0], dy)
        yc, dxc = cpu_pool(maximum, x, maps, out.shape[0], dy)
        assert torch.equal(y, yc) and torch.equal(dx, dxc)
    assert "pool_out_table" not in maps.cache


def test_bad_tables_raise(gpu_place):
    ops, dev = gpu_place.ops, gpu_place.device
    idx, out, maps = kernel_map(gpu_place, 3, seed=2)
    nbr = maps.in_table.new_full((out.shape[0], maps.in_table.shape[1]), -1)
    nbr[0, 0] = idx.shape[0]  # one past the features
    x = gpu_place.to(torch.randn(idx.shape[0], 2))
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        ops.indice_maxpool_table(x, nbr, nbr[:0])
    with pytest.raises(ValueError, match="map_info says the table indexes"):
        ops.indice_avgpool_table(x[:-1], maps.in_table[:, :].new_full((out.shape[0], 27), -1), x.new_empty(
            (0, 27), dtype=torch.int32), maps.info)
    with pytest.raises(TypeError, match="nbr must be int32"):
        ops.indice_maxpool_table(x, nbr.long(), nbr[:0])
    with pytest.raises(ValueError, match="nbr_t must have one row per input"):
        ops.indice_maxpool_table(x, nbr.clamp(max=0), nbr)
    y, arg = ops.indice_maxpool_table(x, nbr.clamp(max=0), maps.in_table)
    with pytest.raises(TypeError, match="argmax must be"):
        ops.indice_maxpool_table_backward(y, arg.int(), maps.in_table)
    with pytest.raises(ValueError, match="count must be >= 1"):
        ops.indice_avgpool_table_backward(y, torch.zeros(out.shape[0], dtype=torch.int32, device=dev), maps.in_table)
    with gpu_place.active():
        with torch.no_grad():  # no reversed table: no backward
            y, _ = ops.indice_maxpool_table(x, nbr.clamp(max=0), nbr[:0])
        xg = x.clone().requires_grad_(True)
        y, _ = ops.indice_maxpool_table(xg, nbr.clamp(max=0), nbr[:0])
        with pytest.raises(RuntimeError, match="without the reversed table"):
            y.sum().backward()


def test_opcheck_table_ops(gpu_place):
    ops = gpu_place.ops
    idx, out, maps = kernel_map(gpu_place, 3, n=60, seed=8)
    with gpu_place.active():
        from spconv.pytorch import _pool_table
        nbr, nbr_t = _pool_table.out_table(maps), _pool_table.in_table(maps)
    x = gpu_place.to(features(idx.shape[0], 4, torch.float32))
    for op in (ops.indice_maxpool_table, ops.indice_avgpool_table):
        torch.library.opcheck(op, (x.clone().requires_grad_(True), nbr, nbr_t))
        torch.library.opcheck(op, (x, nbr, nbr_t[:0], maps.info))
    y, arg = ops.indice_maxpool_table(x, nbr, nbr_t)
    _, count = ops.indice_avgpool_table(x, nbr, nbr_t)
    torch.library.opcheck(ops.indice_maxpool_table_backward, (torch.randn_like(y), arg, nbr_t))
    torch.library.opcheck(ops.indice_avgpool_table_backward, (torch.randn_like(y), count, nbr_t, maps.info))
    torch.library.opcheck(ops.transpose_neighbour_table, (nbr, idx.shape[0]))
