"""The WMMA emulator (csrc/hip/emu/wmma_emu.h) against a plain matrix product of the same rounded inputs."""
import os

import numpy as np
import pytest

from conftest import hip_cpu_program, run_program
from support.tiles import exact_fp32_product, from_bits, random_bits, within_fp32_rounding

pytestmark = pytest.mark.hip_cpu


@pytest.fixture(scope="module")
def exe():
    return hip_cpu_program("wmma_emu_test", ["test/hip_cpu/wmma_emu_test.cu"], ["SPCONV_EMULATE_WMMA=1"])


def place(tiles, layout, ldm):
    """[n, 16, 16] logical tiles -> [n, 16 * ldm] memory in `layout` (padding holds a marker value)."""
    mem = np.full((tiles.shape[0], 16, ldm), 0x7e00, dtype=np.uint16)  # fp16 NaN / bf16 large: must not be read
    mem[:, :, :16] = tiles if layout == "row" else tiles.transpose(0, 2, 1)
    return mem.reshape(tiles.shape[0], -1)


def run_tiles(exe, tmp_path, dtype, la, lb, ld, steps, ldm, c0, seed):
    rng = np.random.default_rng(seed)
    a = random_bits(rng, dtype, (2, steps, 16, 16))
    b = random_bits(rng, dtype, (2, steps, 16, 16))
    inp = np.concatenate([place(a.reshape(-1, 16, 16), la, ldm).ravel(), place(b.reshape(-1, 16, 16), lb, ldm).ravel()])
    inp.tofile(tmp_path / "in.bin")
    run_program(exe, dtype, la, lb, ld, steps, ldm, repr(c0), tmp_path / "in.bin", tmp_path / "out.bin")
    mem = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(2, 16, ldm)
    assert np.isnan(mem[:, :, 16:]).all(), "stored outside the tile"
    d = mem[:, :, :16] if ld == "row" else mem[:, :, :16].transpose(0, 2, 1)
    return from_bits(a, dtype), from_bits(b, dtype), d


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("la,lb,ld", [("row", "row", "row"), ("col", "row", "row"), ("row", "col", "col"),
                                      ("col", "col", "row")])
@pytest.mark.parametrize("steps", [1, 5])
def test_tile_product(exe, tmp_path, dtype, la, lb, ld, steps):
    c0 = 0.375 if steps > 1 else 0.0
    a, b, d = run_tiles(exe, tmp_path, dtype, la, lb, ld, steps, 24, c0, seed=steps * 7 + len(la + lb + ld))
    for w in range(2):  # each warp its own data
        # Exactly the sequential fp32 sum the emulator documents ...
        np.testing.assert_array_equal(d[w], exact_fp32_product(a[w], b[w], c0))
        # ... and a plain fp64 product within fp32 rounding.
        within_fp32_rounding(d[w], a[w], b[w], c0)


def test_checks_documented_ldm(exe, tmp_path):
    """ldm must be a multiple of 8 elements for 16-bit types: the emulator refuses 20."""
    np.zeros(2 * 2 * 16 * 20, dtype=np.uint16).tofile(tmp_path / "in.bin")
    r = run_program(exe, "f16", "row", "row", "row", 1, 20, "0", tmp_path / "in.bin", tmp_path / "out.bin",
                     expect_ok=False)
    assert r.returncode != 0 and "ldm" in r.stderr
    assert not os.path.exists(tmp_path / "out.bin")
