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


def tf32_rna(x):
    """cvt.rna.tf32.f32 (10 mantissa bits, to nearest, ties away from zero) on finite fp32 values."""
    u = np.asarray(x, dtype=np.float32).view(np.uint32)
    return ((u + np.uint32(0x1000)) & np.uint32(0xFFFFE000)).view(np.float32)


def place_f32(tiles, rows, cols, layout, ldm):
    """[n, rows, cols] logical fp32 tiles -> [n, 16 * ldm] memory in `layout` (the rest NaN: must not be read)."""
    mem = np.full((tiles.shape[0], 16, ldm), np.nan, dtype=np.float32)
    if layout == "row":
        mem[:, :rows, :cols] = tiles
    else:
        mem[:, :cols, :rows] = tiles.transpose(0, 2, 1)
    return mem.reshape(tiles.shape[0], -1)


@pytest.mark.parametrize("la,lb,ld", [("row", "row", "row"), ("col", "row", "col"), ("row", "col", "row")])
@pytest.mark.parametrize("steps", [1, 4])
def test_tf32_tile_product(exe, tmp_path, la, lb, ld, steps):
    """m16n16k8 TF32: the loaded fp32 elements rounded by __float_to_tf32 (ties away from zero: halfway values
    included), then exact products added one at a time in (step, k) order."""
    rng = np.random.default_rng(steps * 3 + len(la + lb + ld))
    a = (rng.standard_normal((2, steps, 16, 8)) * 4).astype(np.float32)
    b = (rng.standard_normal((2, steps, 8, 16)) * 4).astype(np.float32)
    a.reshape(-1)[::7] = np.float32(1 + 2.0 ** -11)  # exactly halfway between two tf32 values: rounds up
    b.reshape(-1)[::5] = np.float32(-(1 + 3 * 2.0 ** -11))  # halfway, negative: rounds away from zero
    ldm = 20
    inp = np.concatenate([place_f32(a.reshape(-1, 16, 8), 16, 8, la, ldm).ravel(),
                          place_f32(b.reshape(-1, 8, 16), 8, 16, lb, ldm).ravel()])
    inp.tofile(tmp_path / "in.bin")
    c0 = 0.375
    run_program(exe, "tf32", la, lb, ld, steps, ldm, repr(c0), tmp_path / "in.bin", tmp_path / "out.bin")
    mem = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(2, 16, ldm)
    assert np.isnan(mem[:, :, 16:]).all(), "stored outside the tile"
    d = mem[:, :, :16] if ld == "row" else mem[:, :, :16].transpose(0, 2, 1)
    assert tf32_rna(np.float32(1 + 2.0 ** -11)) == np.float32(1 + 2.0 ** -10)
    assert tf32_rna(np.float32(-(1 + 3 * 2.0 ** -11))) == np.float32(-(1 + 2.0 ** -9))
    for w in range(2):
        ra, rb = tf32_rna(a[w]), tf32_rna(b[w])
        np.testing.assert_array_equal(d[w], exact_fp32_product(ra, rb, c0))
        within_fp32_rounding(d[w], ra, rb, c0)


def test_tf32_refuses_unconverted_operands(exe, tmp_path):
    """mma_sync takes TF32 operands made by __float_to_tf32 (as CUDA requires): raw fp32 values abort."""
    x = np.full(2 * 2 * 16 * 8, 1.1, dtype=np.float32)
    x.tofile(tmp_path / "in.bin")
    r = run_program(exe, "tf32-raw", "row", "row", "row", 1, 8, "0", tmp_path / "in.bin", tmp_path / "out.bin",
                    expect_ok=False)
    assert r.returncode != 0 and "__float_to_tf32" in r.stderr
