"""The fused route's work against the useful work (spconv/benchmark/fused_work.py) and the mask-split policy that
keeps it low (spconv/pytorch/_fused.py): counts by hand on small tables, the real scan's basic network within
1.3 multiply-adds per useful one, and a layer on two splits giving the one-split route's results (dinput of a
mirrored map on its forward table reversed, bit for bit the reversed pairs' tables)."""
import os

import numpy as np
import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend
from spconv.benchmark import flops, fused_work, network, scenes
from spconv.pytorch import _fused, _native
from support.sites import random_coords

ops = torch.ops.spconv
REAL_SCAN = os.environ.get("SPCONV_REAL_SCAN", os.path.join(os.path.dirname(__file__), "..", "..", "shared", "data",
                                                          "lidar-voxels-125k.npz"))


def brute_work(nbr, masks, order):
    """(tile rows, 16-row-group rows) by plain loops: per split, per 64-row tile of its order, per offset of the
    split whose mask bit any tile row has."""
    rows, kvol = nbr.shape
    splits = masks.shape[0]
    tile_rows = mma_rows = 0
    for s in range(splits):
        k0, k1 = s * kvol // splits, (s + 1) * kvol // splits
        gs = max(1, (k1 - k0 + 31) // 32)
        seq = order[s].tolist()
        for t0 in range(0, rows, 64):
            tile = seq[t0:t0 + 64] + [-1] * max(0, t0 + 64 - rows)
            bits = 0
            for r in tile:
                if r >= 0:
                    bits |= int(masks[s, r]) & 0xFFFFFFFF
            for k in range(k0, k1):
                if not (bits >> ((k - k0) // gs)) & 1:
                    continue
                tile_rows += 64
                for g in range(4):
                    if any(r >= 0 and nbr[r, k] >= 0 for r in tile[16 * g:16 * g + 16]):
                        mma_rows += 16
    return tile_rows, mma_rows


@pytest.mark.parametrize("splits", [1, 2, 3])
@pytest.mark.parametrize("rows,kvol,density", [(70, 27, 0.3), (150, 8, 0.1), (200, 40, 0.2), (5, 27, 0.5)])
def test_table_work_matches_the_kernels_walk(rows, kvol, density, splits):
    """kvol 40: two offsets per mask bit; 5 rows: one tile, mostly padding."""
    g = torch.Generator().manual_seed(rows + kvol + splits)
    nbr = torch.where(torch.rand(rows, kvol, generator=g) < density,
                      torch.randint(0, 1000, (rows, kvol), generator=g), torch.full((rows, kvol), -1)).int()
    masks, order = ops.fused_map_masks(nbr, splits)
    work = fused_work.table_work(nbr, masks, order)
    assert (work.tile_rows, work.mma_rows) == brute_work(nbr, masks, order)
    assert work.pairs == int((nbr >= 0).sum()) and work.splits == splits
    assert work.mma_rows <= work.tile_rows


def test_split_policy():
    assert _fused.split_count(27, 0, _fused.SPLIT_WORK - 1) == 1
    assert _fused.split_count(27, 0, _fused.SPLIT_WORK) == 2
    assert _fused.split_count(27, 3, 0) == 3  # asked for: kept
    assert _fused.split_count(2, 0, 10 * _fused.SPLIT_WORK) == 2
    assert _fused.split_count(27, 9) == _fused.MAX_SPLITS


def test_real_scan_basic_network_work():
    """The benchmark's basic network on the real scan: the forward and dinput multiply at most 1.3 rows per useful
    neighbour pair, weighted by the layers' useful FLOPs (one split everywhere: 1.65); the benchmark reports it."""
    if not os.path.isfile(REAL_SCAN):
        pytest.skip("the real scan is not beside this checkout (SPCONV_REAL_SCAN)")
    feats, idx, shape = scenes.load_voxels_npz(REAL_SCAN)
    torch.manual_seed(0)
    net = network.build_basic_net(spconv)
    x = spconv.SparseConvTensor(torch.from_numpy(feats), torch.from_numpy(idx), shape, 1)
    convs = []
    for m in net.children():
        if isinstance(m, spconv.SubMConv3d):
            m.register_forward_hook(lambda mod, inp, out: convs.append((mod, out)))
    with torch.no_grad():
        net(x)
    rows, single = [], []
    for mod, out in convs:
        maps = out.indice_dict[mod.indice_key].maps
        cin, cout = mod.in_channels, mod.out_channels
        row = dict(fused_work.layer_work(maps, cin, cout), pairs=int(maps.pair_offsets[-1]), cin=cin, cout=cout)
        rows.append(row)
        one = fused_work.table_work(*_fused.fused_tables(maps, 1))
        single.append(dict(row, fused_fwd_mma=one.mma_ratio))
        assert row["fused_fwd_mma"] <= row["fused_fwd_tile"]
        assert (row["fused_splits"] == 2) == (maps.num_out * cin * cout >= _fused.SPLIT_WORK)
    fwd, dx = flops.weighted_ratio(rows, "fused_fwd_mma"), flops.weighted_ratio(rows, "fused_dx_mma")
    assert fwd <= 1.3 and dx <= 1.3, (fwd, dx)
    assert flops.weighted_ratio(single, "fused_fwd_mma") > 1.5  # what the splits save
    # A body that multiplies every row of its tiles (MFMA) computes the per-tile rows: its split policy (three
    # above SPLIT_WORK) keeps them within 1.3 too, forward and dinput.
    wide = []
    for (mod, out), row in zip(convs, rows):
        maps = out.indice_dict[mod.indice_key].maps
        s = _fused.WIDE_SPLITS_MFMA if maps.num_out * mod.in_channels * mod.out_channels >= _fused.SPLIT_WORK else 1
        wide.append(dict(row, tile=fused_work.table_work(*_fused.fused_tables(maps, s)).tile_ratio,
                         dx_tile=fused_work.table_work(*_fused.dinput_tables(maps, s)[:3]).tile_ratio))
    assert flops.weighted_ratio(wide, "tile") <= 1.3 and flops.weighted_ratio(wide, "dx_tile") <= 1.3
    assert flops.weighted_ratio(rows, "fused_fwd_tile") > 1.3  # with two splits it would not be
    from spconv.benchmark.report import format_layers
    text = format_layers([dict(r, layer=str(i), ms=1.0) for i, r in enumerate(rows)])
    assert "forward %.2f / %.2f" % (flops.weighted_ratio(rows, "fused_fwd_tile"), fwd) in text


@pytest.mark.hip_cpu
@pytest.mark.parametrize("variant", ["simt", "wmma", "mfma", "sm80"])
def test_wide_split_count_by_body(variant):
    """Three splits above SPLIT_WORK where the 16-bit body multiplies every row of its tiles (the emulated MFMA
    variant here; AMD gfx90a / gfx94x on a GPU), two elsewhere; below it one."""
    from conftest import hip_cpu_library
    cpu = torch.device("cpu")
    assert _fused.wide_split_count(cpu) == 2  # the CPU reference route
    with _backend.gpu_code_on_cpu(hip_cpu_library(variant).name):
        wide = _fused.wide_split_count(cpu)
        assert wide == (_fused.WIDE_SPLITS_MFMA if variant == "mfma" else 2)
        assert _fused.split_count(27, 0, _fused.SPLIT_WORK, cpu) == wide
        assert _fused.split_count(27, 0, _fused.SPLIT_WORK - 1, cpu) == 1


@pytest.fixture
def two_splits(monkeypatch):
    """Every layer takes two mask splits (the policy's threshold at zero)."""
    monkeypatch.setattr(_fused, "SPLIT_WORK", 0)


def _subm_layer_grads(x_feats, idx, shape, layer):
    feats = x_feats.clone().requires_grad_(True)
    layer.zero_grad()
    out = layer(spconv.SparseConvTensor(feats, idx, shape, 2))
    g = torch.sin(torch.arange(out.features.numel(), dtype=torch.float32)).view_as(out.features)
    (out.features * g).sum().backward()
    return out, feats.grad.clone(), layer.weight.grad.clone(), g


@pytest.mark.hip_cpu
def test_two_splits_on_the_gpu_code(two_splits, hip_cpu):
    """A SubM layer (mirrored map, built on the device) on two splits: the forward runs two passes, dinput reads
    the forward table with its columns reversed (bit for bit the reversed pairs' tables), and the results are
    the one-split route's within FP32 rounding."""
    shape = [12, 11, 10]
    idx = random_coords(shape, 2, 400, seed=3)
    torch.manual_seed(0)
    layer = spconv.SubMConv3d(24, 40, 3, bias=False, indice_key="k")
    x = torch.randn(idx.shape[0], 24)
    with _backend.gpu_code_on_cpu():
        out, dx, dw, g = _subm_layer_grads(x, idx, shape, layer)
        maps = out.indice_dict["k"].maps
        assert maps.cache["fused_map_s2"][1].shape[0] == 2
        nbr, masks, order = maps.cache["fused_dinput_s2"]
        assert torch.equal(nbr, maps.out_table.flip(1)) and masks.shape[0] == 2
        rev = hip_cpu.build_fused_map(maps.pair_out, maps.pair_in, maps.pair_offsets, maps.num_in, 2)
        w = _native.dense_filters(layer.weight.detach()).contiguous()
        dy = g.to(x.dtype)
        assert torch.equal(dx, hip_cpu.fused_conv(dy, w.transpose(1, 2).contiguous(), *rev))
    with _backend.gpu_code_on_cpu():
        _fused.SPLIT_WORK = 1 << 62
        ref_out, ref_dx, ref_dw, _ = _subm_layer_grads(x, idx, shape, layer)
        assert ref_out.indice_dict["k"].maps.cache["fused_map_s1"][1].shape[0] == 1
    torch.testing.assert_close(out.features, ref_out.features, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dx, ref_dx, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(dw, ref_dw, atol=1e-5, rtol=1e-5)
