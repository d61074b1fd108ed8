"""The MFMA emulator (csrc/hip/emu/mfma_emu.h): its lane layout and its product against a plain matrix product.

The layout is stated here on its own, from the AMD Matrix Instruction Calculator for v_mfma_f32_16x16x16f16 /
v_mfma_f32_16x16x16bf16_1k (lane l, element i): A[l % 16][4 (l / 16) + i], B and C/D [4 (l / 16) + i][l % 16].
v_mfma_i32_16x16x16i8 has the same layout with element i in byte i of the lane's operand word (int32 C/D).
"""
import numpy as np
import pytest

from conftest import hip_cpu_program, run_program
from support.tiles import exact_fp32_product, from_bits, random_bits, to_bits, within_fp32_rounding

pytestmark = pytest.mark.hip_cpu

LANE = np.arange(64)[:, None]
ITEM = np.arange(4)[None, :]
ROW, QUAD = LANE % 16, LANE // 16


def lanes_a(m):
    return m[..., ROW, 4 * QUAD + ITEM]


def lanes_b(m):
    return m[..., 4 * QUAD + ITEM, ROW]


lanes_c = lanes_b  # C and D share B's pattern


def unlanes_d(v):
    out = np.empty(v.shape[:-2] + (16, 16), dtype=v.dtype)
    out[..., 4 * QUAD + ITEM, ROW] = v
    return out


@pytest.fixture(scope="module")
def exe():
    return hip_cpu_program("mfma_emu_test", ["test/hip_cpu/mfma_emu_test.cu"], ["SPCONV_EMULATE_MFMA=1"])


def run_lanes(exe, tmp_path, dtype, a_lanes, b_lanes, c_lanes, threads, cbsz=0, expect_ok=True):
    """a_lanes, b_lanes [waves, steps, 64, 4] bits; c_lanes [waves, 64, 4] fp32 -> D lanes [waves, 64, 4]."""
    steps = a_lanes.shape[1]
    with open(tmp_path / "in.bin", "wb") as f:
        for arr in (a_lanes.astype(np.uint16), b_lanes.astype(np.uint16), c_lanes.astype(np.float32)):
            arr.tofile(f)
    r = run_program(exe, dtype, threads, steps, cbsz, tmp_path / "in.bin", tmp_path / "out.bin", expect_ok=expect_ok)
    if not expect_ok:
        return r
    return np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(c_lanes.shape)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_lane_layout(exe, tmp_path, dtype):
    """Known matrices in, each lane's outputs checked against where the layout puts them."""
    unique = np.arange(256, dtype=np.float32).reshape(16, 16)  # entry 16 r + c, exact in fp16 and bf16
    eye = np.eye(16, dtype=np.float32)
    c = 1000.0 + unique
    # wave 0: D = I B + C = B + C (B's lane pattern); wave 1: D = A I + C = A + C (A's, read back through D's).
    a = np.stack([lanes_a(to_bits(eye, dtype)), lanes_a(to_bits(unique, dtype))])[:, None]
    b = np.stack([lanes_b(to_bits(unique, dtype)), lanes_b(to_bits(eye, dtype))])[:, None]
    d = run_lanes(exe, tmp_path, dtype, a, b, np.stack([lanes_c(c), lanes_c(c)]), threads=128)
    m, n = 4 * QUAD + ITEM, np.broadcast_to(ROW, (64, 4))
    expect = 1000.0 + 16 * m + n + 16 * m + n  # D[m][n] with m = 4 (l / 16) + i, n = l % 16
    for w in range(2):
        bad = np.argwhere(d[w] != expect)
        assert bad.size == 0, f"wave {w}: lane/element {bad[:4].tolist()} got {d[w][tuple(bad[0])]}"


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("steps", [1, 4])
def test_tile_product(exe, tmp_path, dtype, steps):
    rng = np.random.default_rng(11 + steps)
    waves = 3
    a = random_bits(rng, dtype, (waves, steps, 16, 16))
    b = random_bits(rng, dtype, (waves, steps, 16, 16))
    c = rng.standard_normal((waves, 16, 16)).astype(np.float32) if steps > 1 else np.zeros((waves, 16, 16), np.float32)
    d = unlanes_d(run_lanes(exe, tmp_path, dtype, lanes_a(a), lanes_b(b), lanes_c(c), threads=64 * waves))
    af, bf = from_bits(a, dtype), from_bits(b, dtype)
    for w in range(waves):  # each wave its own data
        np.testing.assert_array_equal(d[w], exact_fp32_product(af[w], bf[w], c[w]))
        within_fp32_rounding(d[w], af[w], bf[w], c[w])


def test_needs_whole_waves(exe, tmp_path):
    """A block of 96 threads leaves its second wave half empty: the emulator refuses instead of guessing."""
    z16, zc = np.zeros((2, 1, 64, 4), np.uint16), np.zeros((2, 64, 4), np.float32)
    r = run_lanes(exe, tmp_path, "f16", z16, z16, zc, threads=96, expect_ok=False)
    assert r.returncode != 0 and "64 lanes" in r.stderr


def test_rejects_broadcast_modifiers(exe, tmp_path):
    z16, zc = np.zeros((1, 1, 64, 4), np.uint16), np.zeros((1, 64, 4), np.float32)
    r = run_lanes(exe, tmp_path, "bf16", z16, z16, zc, threads=64, cbsz=1, expect_ok=False)
    assert r.returncode != 0 and "cbsz" in r.stderr


def _i8_bits(m):
    """int8 values as the 16-bit elements the program reads (the value in the low byte)."""
    return (np.asarray(m, np.int64) & 0xFF).astype(np.uint16)


def test_lane_layout_i8(exe, tmp_path):
    unique = np.arange(256).reshape(16, 16) - 128  # entry 16 r + c - 128: distinct int8 values
    eye = np.eye(16, dtype=np.int64)
    c = (1000 + np.arange(256).reshape(16, 16)).astype(np.float32)
    a = np.stack([lanes_a(_i8_bits(eye)), lanes_a(_i8_bits(unique))])[:, None]
    b = np.stack([lanes_b(_i8_bits(unique)), lanes_b(_i8_bits(eye))])[:, None]
    d = run_lanes(exe, tmp_path, "i8", a, b, np.stack([lanes_c(c), lanes_c(c)]), threads=128)
    m, n = 4 * QUAD + ITEM, np.broadcast_to(ROW, (64, 4))
    expect = 1000 + 16 * m + n + (16 * m + n - 128)
    for w in range(2):
        bad = np.argwhere(d[w] != expect)
        assert bad.size == 0, f"wave {w}: lane/element {bad[:4].tolist()} got {d[w][tuple(bad[0])]}"


@pytest.mark.parametrize("steps", [1, 3])
def test_tile_product_i8(exe, tmp_path, steps):
    """Extremes included: -128 * -128 products; the int32 sums are exact."""
    rng = np.random.default_rng(5 + steps)
    waves = 2
    a = rng.integers(-128, 128, (waves, steps, 16, 16))
    b = rng.integers(-128, 128, (waves, steps, 16, 16))
    a[0, 0, 0, :] = -128
    b[0, 0, :, 0] = -128
    c = rng.integers(-1000, 1000, (waves, 16, 16))
    d = unlanes_d(run_lanes(exe, tmp_path, "i8", lanes_a(_i8_bits(a)), lanes_b(_i8_bits(b)),
                            lanes_c(c.astype(np.float32)), threads=64 * waves))
    for w in range(waves):
        want = c[w] + sum(a[w, s] @ b[w, s] for s in range(steps))
        np.testing.assert_array_equal(d[w].astype(np.int64), want)
