"""The GPU builder of regular, transposed and pooling kernel maps (get_indice_pairs with subm=False: four kernels, a
sort, a scan and one host read; csrc/hip/kernel_map.cu), wherever the GPU code runs (``gpu_place``: the HIP CPU
build, in both thread orders of a block, and a GPU when there is one): every output of the CPU route bit for bit
(output rows in first-seen order, pairs by offset then input row, the table, map_info); the CPU route's errors;
strided_kernel_map's out->in table (the same map, plus the table the fused forward and the pools read). On the
HIP CPU build alone: the launch and host-wait budget of the build (its launch ledger)."""
import pytest
import torch

from support.launch_counts import count
from support.places import in_both_orders, per_place
from support.sites import coords

cpu = torch.ops.spconv

# name -> (shape, batch, n, ksize, stride, padding, dilation, transpose, repeated rows): 1-D to 4-D, batches,
# strides, paddings, dilations, transposed, pooling shapes, kvol above the kernels' 512 per-block counters,
# duplicate coordinates.
GEOMETRIES = {
    "1d_k3s2": ([40], 2, 25, [3], [2], [1], [1], False, 0),
    "2d_k3s1_dups": ([20, 20], 2, 90, [3, 3], [1, 1], [1, 1], [1, 1], False, 30),
    "2d_pool2": ([12, 10], 3, 80, [2, 2], [2, 2], [0, 0], [1, 1], False, 0),
    "3d_k3s2p1": ([9, 8, 7], 2, 150, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False, 0),
    "3d_k2s2": ([8, 8, 8], 1, 100, [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, 0),
    "3d_k3s3_dil2": ([13, 12, 11], 1, 120, [3, 3, 3], [3, 2, 3], [2, 1, 0], [2, 1, 2], False, 0),
    "3d_k5x1x3_dups": ([9, 7, 8], 2, 100, [5, 1, 3], [2, 1, 2], [2, 0, 1], [1, 1, 1], False, 20),
    "3d_deconv": ([5, 4, 6], 2, 40, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], True, 0),
    "3d_deconv_dups": ([5, 5, 5], 1, 40, [2, 3, 2], [2, 1, 3], [0, 1, 0], [1, 1, 2], True, 10),
    "4d_k2": ([4, 4, 4, 3], 1, 60, [2, 2, 2, 2], [1, 1, 1, 1], [0, 0, 0, 0], [1, 1, 1, 1], False, 0),
    "4d_k5_kvol625": ([6, 6, 5, 5], 1, 30, [5, 5, 5, 5], [1, 1, 1, 1], [2, 2, 2, 2], [1, 1, 1, 1], False, 0),
    "empty": ([5, 5, 5], 1, 0, [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False, 0),
}


def out_shape_of(shape, ksize, stride, padding, dilation, transpose):
    if transpose:
        return [(s - 1) * t - 2 * p + d * (k - 1) + 1 for s, k, t, p, d in zip(shape, ksize, stride, padding, dilation)]
    return [(s + 2 * p - d * (k - 1) - 1) // t + 1 for s, k, t, p, d in zip(shape, ksize, stride, padding, dilation)]


def geometry(name):
    shape, batch, n, ksize, stride, padding, dilation, transpose, dups = GEOMETRIES[name]
    idx = coords(shape, batch, n, seed=len(name), dups=dups) if n else torch.zeros(0, len(shape) + 1,
                                                                                     dtype=torch.int32)
    out_shape = out_shape_of(shape, ksize, stride, padding, dilation, transpose)
    return idx, (batch, shape, out_shape, ksize, stride, padding, dilation, False, transpose)


def assert_same_map(got, ref):
    names = ("out_indices", "pair_in", "pair_out", "pair_offsets", "map_info", "table")
    for name, a, b in zip(names, got, ref):
        a = a.cpu()
        assert a.dtype == b.dtype and a.shape == b.shape, (name, a.shape, b.shape)
        assert torch.equal(a, b), name


@per_place("name", in_both_orders(sorted(GEOMETRIES), sorted(GEOMETRIES)), ids=str)
def test_equal_to_the_cpu_route(name, gpu_place):
    idx, args = geometry(name)
    ref = cpu.get_indice_pairs(idx, *args)
    got = gpu_place.ops.get_indice_pairs(gpu_place.to(idx), *args)
    assert_same_map(got, ref)
    if GEOMETRIES[name][8]:
        assert not bool(ref[4][-1] & 1)  # repeated coordinates: map_info's repeat-free flag is clear


def out_table_of(pair_in, pair_out, pair_offsets, num_out):
    """[num_out, kvol]: the input of each output's pair through each offset (-1: none), from the pairs."""
    kvol = pair_offsets.numel() - 1
    table = torch.full((num_out, kvol), -1, dtype=torch.int32)
    k = torch.repeat_interleave(torch.arange(kvol), pair_offsets.diff())
    table[pair_out.long(), k] = pair_in
    return table


@per_place("name", in_both_orders(sorted(GEOMETRIES), sorted(GEOMETRIES)), ids=str)
def test_strided_kernel_map_tables(name, gpu_place):
    """get_indice_pairs' map and the out->in table from the pairs; none ([0, kvol]) where coordinates repeat."""
    idx, args = geometry(name)
    ref = cpu.get_indice_pairs(idx, *args)
    batch, shape, out_shape, ksize, stride, padding, dilation, _, transpose = args
    got = gpu_place.ops.strided_kernel_map(gpu_place.to(idx), batch, shape, out_shape, ksize, stride, padding,
                                           dilation, transpose)
    assert_same_map(got[:6], ref)
    table = got[6].cpu()
    kvol = ref[3].numel() - 1
    if GEOMETRIES[name][8]:
        assert table.shape == (0, kvol)
    else:
        assert table.dtype == torch.int32
        assert torch.equal(table, out_table_of(ref[1], ref[2], ref[3], ref[0].shape[0]))


def test_large_grid_64bit_keys(gpu_place):
    """batch x grid above 2^32: the input and output keys need 64 bits."""
    shape = [3000, 3000, 1000]
    g = torch.Generator().manual_seed(3)
    base = torch.stack([torch.randint(0, 3, (80,), generator=g)] +
                       [torch.randint(1, s - 2, (80,), generator=g) for s in shape], 1).int()
    idx = torch.unique(torch.cat([base, base + torch.tensor([0, 1, 0, 1], dtype=torch.int32)]), dim=0)
    idx = idx[torch.randperm(idx.shape[0], generator=g)]
    for transpose in (False, True):
        out_shape = out_shape_of(shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, transpose)
        args = (idx, 3, shape, out_shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False, transpose)
        ref = cpu.get_indice_pairs(*args)
        assert ref[0].shape[0] > 0 and int(ref[0][:, 1:].max()) > 1000
        assert_same_map(gpu_place.ops.get_indice_pairs(gpu_place.to(idx), *args[1:]), ref)


def test_deterministic(gpu_place):
    idx, args = geometry("2d_k3s1_dups")
    idx = gpu_place.to(idx)
    first = [t.cpu() for t in gpu_place.ops.get_indice_pairs(idx, *args)]
    for _ in range(2):
        assert_same_map(gpu_place.ops.get_indice_pairs(idx, *args), first)


# The launch and host-wait budget counts through the HIP CPU build's launch ledger (debug_launch_ledger): it stays
# on the hip_cpu fixture.
@pytest.mark.parametrize("transpose", [False, True])
def test_build_budget(transpose, hip_cpu):
    """Four kernels, at most 8 launches (with the sort and the scan; on a GPU also the one device->host copy),
    exactly one host read. Before: 9 kernels, some 60 ATen launches."""
    shape = [12, 11, 10]
    idx = coords(shape, 2, 300, seed=5, dups=10)
    out_shape = out_shape_of(shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, transpose)
    args = (idx, 2, shape, out_shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False, transpose)
    c = count(hip_cpu, lambda: hip_cpu.get_indice_pairs(*args))
    assert c["kernels"] == 4, c
    assert c["kernels"] + c["aten"] + c["waits"] <= 8, c
    assert c["waits"] == 1, c


def test_strided_kernel_map_budget(hip_cpu):
    """get_indice_pairs' build and one fill more (the out->in table, written by its last kernel): at most 8
    launches with the host read, which stays the only one."""
    shape = [12, 11, 10]
    idx = coords(shape, 2, 300, seed=5)
    args = (idx, 2, shape, out_shape_of(shape, [3] * 3, [2] * 3, [1] * 3, [1] * 3, False), [3] * 3, [2] * 3, [1] * 3,
            [1] * 3, False)
    c = count(hip_cpu, lambda: hip_cpu.strided_kernel_map(*args))
    assert c["kernels"] == 4, c
    assert c["kernels"] + c["aten"] + c["waits"] <= 8, c
    assert c["waits"] == 1, c


@pytest.mark.parametrize("row, col, value, what", [
    (17, 0, 2, "batch index outside"),
    (17, 2, 8, "coordinate outside spatial_shape"),
    (3, 3, -1, "coordinate outside spatial_shape"),
    (0, 0, -5, "batch index outside"),
])
def test_errors_of_the_cpu_route(row, col, value, what, gpu_place):
    shape = [9, 8, 7]
    idx = coords(shape, 2, 60, seed=3)
    idx[row, col] = value
    idx[row + 20, 1] = shape[0]  # a later bad row: the message names the first one
    args = (idx, 2, shape, [5, 4, 4], [3] * 3, [2] * 3, [1] * 3, [1] * 3, False, False)
    with pytest.raises(ValueError) as ref:
        cpu.get_indice_pairs(*args)
    with pytest.raises(ValueError) as got:
        gpu_place.ops.get_indice_pairs(gpu_place.to(idx), *args[1:])
    assert str(got.value).splitlines()[0] == str(ref.value).splitlines()[0]
    assert f"indices row {row} " in str(got.value) and what in str(got.value)
