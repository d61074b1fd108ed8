"""The submanifold map's deferred checks (csrc/ops/gpu/subm_pending.h), wherever the GPU code runs (``gpu_place``:
the HIP CPU build, and a GPU when there is one). A SubM map is built with no host read, so bad indices
(coordinates out of the grid, a repeated coordinate) found by its kernels raise at the next host read of the GPU
glue: a regular or pooling map's one read, which carries the pending statuses, or the map's own read of its pairs
(the native route), or a full ring of pending maps. Only on the HIP CPU build (its launch ledger counts the
launches): good indices cost no host wait of their own."""
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend
from support.launch_counts import count
from support.sites import coords

SHAPE = [12, 11, 10]
RING = 64  # kSubmPendingRows


def _bad(kind):
    idx = coords(SHAPE, 2, 200, seed=3)
    if kind == "duplicate":
        idx[25] = idx[9]
        return idx, r"indices row 25 repeats the coordinate"
    idx[17, 2] = SHAPE[1]
    return idx, r"indices row 17"


def _subm_net():
    torch.manual_seed(0)
    return spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3, indice_key="a"), spconv.SubMConv3d(8, 8, 3,
                                                                                                  indice_key="a"))


def _tensor(idx, channels=3, device="cpu"):
    return spconv.SparseConvTensor(torch.randn(idx.shape[0], channels).to(device), idx.to(device), SHAPE, 2)


def _settle(ops):
    """No check pending from an earlier test: what follows counts its own maps only."""
    _backend.debug_library(ops).debug_check_pending_maps()
    return ops


@pytest.mark.parametrize("kind", ["duplicate", "out_of_grid"])
@pytest.mark.parametrize("next_layer", ["maxpool", "strided_conv"])
def test_bad_subm_indices_raise_at_the_next_map_read(gpu_place, kind, next_layer):
    _settle(gpu_place.ops)
    dev = gpu_place.device
    bad, message = _bad(kind)
    good = coords(SHAPE, 2, 150, seed=4)
    nxt = (spconv.SparseMaxPool3d(2, 2) if next_layer == "maxpool" else spconv.SparseConv3d(3, 4, 3, 2)).to(dev)
    with gpu_place.active(), torch.no_grad():
        _subm_net().to(dev)(_tensor(bad, device=dev))  # the fused route: no host read, nothing raised yet
        with pytest.raises(ValueError, match=message) as info:
            nxt(_tensor(good, device=dev))
        assert "built earlier without a host read" in str(info.value)
        nxt(_tensor(good, device=dev))  # raised once: the ring was read and cleared


@pytest.mark.parametrize("kind", ["duplicate", "out_of_grid"])
def test_full_ring_is_read_on_its_own(gpu_place, kind):
    """A run of SubM maps with no other host read: the map that finds the ring full reads it (one wait), and
    raises there for a bad map among them."""
    ops = _settle(gpu_place.ops)
    debug = _backend.debug_library(ops)
    good = gpu_place.to(coords(SHAPE, 2, 150, seed=4))
    build = lambda idx: ops.subm_kernel_map(idx, 2, SHAPE, [3, 3, 3], [1, 1, 1], 1)  # noqa: E731
    before = debug.host_copy_count()
    for _ in range(RING):
        build(good)
    assert debug.host_copy_count() == before
    build(good)
    assert debug.host_copy_count() == before + 1
    bad, message = _bad(kind)
    build(gpu_place.to(bad))
    for _ in range(RING - 2):
        build(good)
    with pytest.raises(ValueError, match=message):
        build(good)


# The HIP CPU build alone: its launch ledger counts the project's launches.
def test_good_indices_add_one_launch_and_no_wait(hip_cpu):
    """The pending statuses ride on the strided map's one read: one concatenation, no extra host wait."""
    settled = _settle(hip_cpu)
    good = coords(SHAPE, 2, 150, seed=4)
    pool = spconv.SparseMaxPool3d(2, 2)
    with _backend.gpu_code_on_cpu(settled.name), torch.no_grad():
        alone = count(settled, lambda: pool(_tensor(good)))
        net = _subm_net()
        net(_tensor(good))  # (its first call also makes the layers' dense filters, kept for the calls below)

        def both():
            net(_tensor(good))
            pool(_tensor(good))

        subm = count(settled, lambda: net(_tensor(good)))
        together = count(settled, both)
    assert subm["waits"] == 0 and alone["waits"] == 1 and together["waits"] == 1, (subm, alone, together)
    assert together["kernels"] == subm["kernels"] + alone["kernels"]
    assert together["aten"] == subm["aten"] + alone["aten"] + 1, (together["ops"], subm["ops"], alone["ops"])


def test_a_map_checked_by_its_own_read_does_not_raise_again(gpu_place):
    ops = _settle(gpu_place.ops)
    bad, message = _bad("duplicate")
    bad = gpu_place.to(bad)
    m = ops.subm_kernel_map(bad, 2, SHAPE, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError, match=message):
        ops.subm_map_pairs(bad, 2, SHAPE, [3, 3, 3], [1, 1, 1], m[0], m[3], m[4])
    _backend.debug_library(ops).debug_check_pending_maps()  # nothing left to raise


def test_pending_check_can_be_forced(gpu_place):
    ops = _settle(gpu_place.ops)
    bad, message = _bad("out_of_grid")
    ops.subm_kernel_map(gpu_place.to(bad), 2, SHAPE, [3, 3, 3], [1, 1, 1], 1)
    with pytest.raises(ValueError, match=message):
        _backend.debug_library(ops).debug_check_pending_maps()
    _backend.debug_library(ops).debug_check_pending_maps()
