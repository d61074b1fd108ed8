"""The GPU submanifold kernel map (subm_kernel_map: three kernels and a sort of the fused route's row masks, no
host read) and its pairs (subm_map_pairs: the map's one host read, made when first needed), wherever the GPU code
runs (``gpu_place``: the HIP CPU build, and a GPU when there is one): the same pairs, per-offset order, tables,
masks and order as the CPU route and the fused route's own table builder, bit for bit; the layers on both GPU
routes against the CPU route; the checks of the indices, made on the device and raised at the host read. On the
HIP CPU build alone: the launch and host-wait budget of the build (its launch ledger)."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from support.launch_counts import count
from support.sites import coords, random_coords

cpu = torch.ops.spconv

# name -> (shape, batch, n, ksize, dilation): 1-D to 4-D, odd (mirrored) and even kernels, kvol 1 to 125,
# dilation, a dense block, a grid too large for 32-bit keys.
GEOMETRIES = {
    "1d_k3": ([50], 2, 30, [3], [1]),
    "2d_k3_b3": ([9, 9], 3, 70, [3, 3], [1, 1]),
    "2d_k12": ([9, 9], 2, 70, [1, 2], [1, 1]),
    "3d_k3": ([6, 7, 5], 2, 120, [3, 3, 3], [1, 1, 1]),
    "3d_dense": ([4, 4, 4], 1, 64, [3, 3, 3], [1, 1, 1]),
    "3d_k5": ([7, 7, 7], 1, 90, [5, 5, 5], [1, 1, 1]),
    "3d_k1": ([6, 6, 6], 1, 50, [1, 1, 1], [1, 1, 1]),
    "3d_k2": ([6, 6, 6], 1, 80, [2, 2, 2], [1, 1, 1]),
    "3d_k3x1x3_dil2": ([10, 10, 10], 2, 100, [3, 1, 3], [2, 1, 2]),
    "4d_k3": ([4, 4, 4, 3], 1, 60, [3, 3, 3, 3], [1, 1, 1, 1]),
    "empty": ([5, 5, 5], 1, 0, [3, 3, 3], [1, 1, 1]),
}


def geometry(name):
    shape, batch, n, ksize, dil = GEOMETRIES[name]
    idx = random_coords(shape, batch, n, seed=len(name))
    return idx, (batch, shape, ksize, dil)


def cpu_map(idx, batch, shape, ksize, dil):
    nd = len(shape)
    return cpu.get_indice_pairs(idx, batch, shape, shape, ksize, [1] * nd, [0] * nd, dil, True, False)


def kvol_of(ksize):
    v = 1
    for k in ksize:
        v *= k
    return v


@pytest.mark.parametrize("name", sorted(GEOMETRIES))
def test_pairs_and_tables_equal_the_cpu_route(name, gpu_place):
    idx, (batch, shape, ksize, dil) = geometry(name)
    _, pin, pout, poff, info, _ = cpu_map(idx, batch, shape, ksize, dil)
    splits = min(1, kvol_of(ksize))
    ops, on, didx = gpu_place.ops, gpu_place.to, gpu_place.to(idx)
    nbr, masks, order, offsets, status = ops.subm_kernel_map(didx, batch, shape, ksize, dil, splits)
    assert torch.equal(offsets.cpu(), poff)
    got_in, got_out, got_info = ops.subm_map_pairs(didx, batch, shape, ksize, dil, nbr, offsets, status)
    assert torch.equal(got_in.cpu(), pin) and torch.equal(got_out.cpu(), pout) and torch.equal(got_info.cpu(), info)
    # The table and the fused route's masks and order: those of the fused route's builder over the CPU pairs.
    ref_nbr, ref_masks, ref_order = ops.build_fused_map(on(pin), on(pout), on(poff), idx.shape[0], splits)
    assert torch.equal(nbr.cpu(), ref_nbr.cpu())
    assert torch.equal(masks.cpu(), ref_masks.cpu()) and torch.equal(order.cpu(), ref_order.cpu())
    # get_indice_pairs (which runs the same kernels) gives the CPU route's results too.
    nd = len(shape)
    res = ops.get_indice_pairs(didx, batch, shape, shape, ksize, [1] * nd, [0] * nd, dil, True, False)
    for a, b in zip(res, cpu_map(idx, batch, shape, ksize, dil)):
        assert torch.equal(a.cpu(), b)


@pytest.mark.parametrize("splits", [1, 2, 3, 4])
@pytest.mark.parametrize("ksize", [[3, 3, 3], [5, 5, 5], [4, 4, 2]])
def test_masks_of_every_split_count(ksize, splits, gpu_place):
    """Masks with bit 31 set (kvol 125 in one, two or four splits) sort as unsigned, like fused_map_masks'."""
    shape = [9, 9, 9]
    idx = gpu_place.to(random_coords(shape, 2, 400, seed=splits))
    nbr, masks, order, _, _ = gpu_place.ops.subm_kernel_map(idx, 2, shape, ksize, [1, 1, 1], splits)
    ref_masks, ref_order = gpu_place.ops.fused_map_masks(nbr, splits)
    masks = masks.cpu()
    assert torch.equal(masks, ref_masks.cpu()) and torch.equal(order.cpu(), ref_order.cpu())
    kvol = kvol_of(ksize)
    for s in range(splits):  # a split whose last mask bit is 31: masks below 0 as int32, the unsigned order tested
        span = (s + 1) * kvol // splits - s * kvol // splits
        if (span - 1) // max(1, -(-span // 32)) == 31:
            assert bool((masks[s] < 0).any())


def test_large_grid_64bit_keys(gpu_place):
    """batch x grid above 2^32: the packed keys need 64 bits."""
    shape = [3000, 3000, 1000]
    g = torch.Generator().manual_seed(3)
    base = torch.stack([torch.randint(0, 3, (60,), generator=g)] +
                       [torch.randint(1, s - 2, (60,), generator=g) for s in shape], 1).int()
    near = base + torch.tensor([0, 1, 0, 1], dtype=torch.int32)  # neighbours of the base rows
    idx = torch.unique(torch.cat([base, near]), dim=0)
    idx = idx[torch.randperm(idx.shape[0], generator=g)]
    _, pin, pout, poff, info, _ = cpu_map(idx, 3, shape, [3, 3, 3], [1, 1, 1])
    assert pin.numel() > idx.shape[0]  # neighbours were found
    didx = gpu_place.to(idx)
    nbr, _, _, offsets, status = gpu_place.ops.subm_kernel_map(didx, 3, shape, [3, 3, 3], [1, 1, 1], 1)
    got = [t.cpu() for t in gpu_place.ops.subm_map_pairs(didx, 3, shape, [3, 3, 3], [1, 1, 1], nbr, offsets, status)]
    assert torch.equal(got[0], pin) and torch.equal(got[1], pout) and torch.equal(got[2], info)


# The launch and host-wait budgets count through the HIP CPU build's launch ledger (debug_launch_ledger): they
# stay on the hip_cpu fixture.
def test_build_budget_no_host_wait(hip_cpu):
    """subm_kernel_map: at most 6 launches (3 kernels + the masks' sort and its int32 order), no host read."""
    shape = [12, 11, 10]
    idx = coords(shape, 2, 300, seed=5)
    c = count(hip_cpu, lambda: hip_cpu.subm_kernel_map(idx, 2, shape, [3, 3, 3], [1, 1, 1], 1))
    assert c["kernels"] == 3, c
    assert c["kernels"] + c["aten"] <= 6, c
    assert c["waits"] == 0, c


def test_subm_layer_forward_without_host_wait(hip_cpu):
    """A SubMConv3d that builds its map on the fused route: the builder's tables go to fused_conv, nothing waits
    for the device, and building the map adds at most 6 launches to the layer with the map cached; the pairs
    are made (one host read) only when something asks for them."""
    shape = [12, 11, 10]
    idx = coords(shape, 2, 300, seed=5)
    torch.manual_seed(0)
    conv = spconv.SubMConv3d(4, 8, 3, indice_key="s")
    x = spconv.SparseConvTensor(torch.randn(idx.shape[0], 4), idx, shape, 2)
    ref = conv(x)
    with _backend.gpu_code_on_cpu(hip_cpu.name), torch.no_grad():
        out = {}
        built = count(hip_cpu, lambda: out.setdefault("y", conv(x)))
        y = out["y"]
        again = spconv.SparseConvTensor(x.features, idx, shape, 2, indice_dict=dict(y.indice_dict))
        cached = count(hip_cpu, lambda: conv(again))
        assert built["waits"] == 0 and cached["waits"] == 0, (built, cached)
        assert built["kernels"] == 4 and cached["kernels"] == 1, (built, cached)  # + the map's three kernels
        assert built["kernels"] + built["aten"] - cached["kernels"] - cached["aten"] <= 6, (built, cached)
        maps = y.indice_dict["s"].maps
        assert not maps.resolved
        torch.testing.assert_close(y.features, ref.features, rtol=1e-5, atol=1e-5)
        before = _backend.debug_library(hip_cpu).host_copy_count()
        ref_maps = ref.indice_dict["s"].maps
        assert torch.equal(maps.pair_in, ref_maps.pair_in) and torch.equal(maps.pair_out, ref_maps.pair_out)
        assert torch.equal(maps.info, ref_maps.info)
        assert _backend.debug_library(hip_cpu).host_copy_count() - before == 1
        assert maps.resolved
        maps.pair_in, maps.info  # resolved once
        assert _backend.debug_library(hip_cpu).host_copy_count() - before == 1


@pytest.mark.parametrize("force_native", [False, True], ids=["fused", "native"])
def test_subm_layer_forward_backward_equals_cpu(force_native, gpu_place):
    shape = [12, 11, 10]
    idx = coords(shape, 2, 300, seed=7)
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SubMConv3d(4, 8, 3, indice_key="s"), torch.nn.ReLU(),
                                  spconv.SubMConv3d(8, 8, 3, indice_key="s"))
    feats = torch.randn(idx.shape[0], 4)

    def run(device):
        net.to(device)
        f = feats.to(device).detach().requires_grad_(True)  # a leaf, also where .to() is a no-op
        y = net(spconv.SparseConvTensor(f, idx.to(device), shape, 2))
        y.features.square().sum().backward()
        return y.features.detach().cpu(), f.grad.cpu(), [p.grad.clone().cpu() for p in net.parameters()]

    ref = run("cpu")
    net.zero_grad()
    old = constants.SPCONV_FORCE_NATIVE
    constants.SPCONV_FORCE_NATIVE = force_native
    try:
        with gpu_place.active():
            got = run(gpu_place.device)
    finally:
        constants.SPCONV_FORCE_NATIVE = old
    torch.testing.assert_close(got[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got[1], ref[1], rtol=1e-5, atol=1e-5)
    for a, b in zip(got[2], ref[2]):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("column, value, words", [
    (1, -1, ["indices row 17", "spatial_shape"]),
    (3, 10, ["indices row 17", "spatial_shape"]),
    (0, 2, ["indices row 17", "batch index"]),
])
def test_bad_coordinates_raise_at_the_host_read(column, value, words, gpu_place):
    shape = [12, 11, 10]
    idx = coords(shape, 2, 200, seed=3)
    bad = idx.clone()
    bad[17, column] = value
    bad[40, column] = value
    bad = gpu_place.to(bad)
    m = gpu_place.ops.subm_kernel_map(bad, 2, shape, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError) as info:
        gpu_place.ops.subm_map_pairs(bad, 2, shape, [3, 3, 3], [1, 1, 1], m[0], m[3], m[4])
    for w in words:
        assert w in str(info.value), (w, str(info.value))
    # The module on the native route reads the map at once: the same error.
    with gpu_place.active():
        old = constants.SPCONV_FORCE_NATIVE
        constants.SPCONV_FORCE_NATIVE = True
        try:
            with pytest.raises(ValueError, match="indices row 17"):
                conv = spconv.SubMConv3d(3, 4, 3).to(gpu_place.device)
                conv(spconv.SparseConvTensor(gpu_place.to(torch.randn(bad.shape[0], 3)), bad, shape, 2))
        finally:
            constants.SPCONV_FORCE_NATIVE = old


def test_duplicates_raise_at_the_host_read(gpu_place):
    shape = [12, 11, 10]
    idx = coords(shape, 2, 200, seed=3)
    dup = idx.clone()
    dup[25] = dup[9]
    dup[31] = dup[4]
    m = gpu_place.ops.subm_kernel_map(gpu_place.to(dup), 2, shape, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError, match=r"indices row 25 repeats the coordinate"):
        gpu_place.ops.subm_map_pairs(gpu_place.to(dup), 2, shape, [3, 3, 3], [1, 1, 1], m[0], m[3], m[4])
    with pytest.raises(ValueError, match=r"indices row 25 repeats the coordinate"):
        cpu_map(dup, 2, shape, [3, 3, 3], [1, 1, 1])


def test_argument_errors_are_raised_at_once(gpu_place):
    shape = [12, 11, 10]
    idx = gpu_place.to(coords(shape, 2, 50, seed=3))
    ops = gpu_place.ops
    with pytest.raises(TypeError, match="indices"):
        ops.subm_kernel_map(idx.long(), 2, shape, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError, match="num_splits"):
        ops.subm_kernel_map(idx, 2, shape, [3, 3, 3], [1, 1, 1], 5)
    m = ops.subm_kernel_map(idx, 2, shape, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError, match="subm_kernel_map's"):
        ops.subm_map_pairs(idx, 2, shape, [3, 3, 3], [1, 1, 1], m[0][:-1], m[3], m[4])


def test_deterministic(gpu_place):
    shape = [20, 20, 20]
    idx = gpu_place.to(coords(shape, 2, 1500, seed=11))
    a = gpu_place.ops.subm_kernel_map(idx, 2, shape, [3, 3, 3], [1, 1, 1], 2)
    for _ in range(2):
        b = gpu_place.ops.subm_kernel_map(idx, 2, shape, [3, 3, 3], [1, 1, 1], 2)
        for u, v in zip(a[:4], b[:4]):
            assert torch.equal(u, v)
