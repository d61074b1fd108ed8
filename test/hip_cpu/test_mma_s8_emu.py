"""The integer MMA emulator (csrc/hip/emu/mma_s8_emu.h): mma.sync.m16n8k32 s8 against a plain integer product,
with the fragment layout stated here on its own, from the PTX ISA ("Matrix Fragments for mma.m16n8k32", .s8):
lane l, g = l // 4, t = l % 4, byte e of a register: A reg j holds A[g + 8 (j % 2)][16 (j // 2) + 4 t + e],
B reg j holds B[16 j + 4 t + e][g], C/D element i is C[g + 8 (i // 2)][2 t + i % 2]."""
import numpy as np
import pytest

from conftest import hip_cpu_program, run_program

pytestmark = pytest.mark.hip_cpu

L = np.arange(32)
G, T = L // 4, L % 4


def pack(m, rows, cols):
    """Registers [32, n] of int8 matrix m, byte e of register j at (rows(j, e), cols(j, e)) per lane."""
    n = rows.shape[1]
    out = np.zeros((32, n), np.uint32)
    for e in range(4):
        out |= (m[rows[:, :, e], cols[:, :, e]].astype(np.int64) & 0xFF).astype(np.uint32) << np.uint32(8 * e)
    return out


J4, J2, E = np.arange(4)[None, :, None], np.arange(2)[None, :, None], np.arange(4)[None, None, :]
A_ROWS = np.broadcast_to(G[:, None, None] + 8 * (J4 % 2), (32, 4, 4))
A_COLS = np.broadcast_to(16 * (J4 // 2) + 4 * T[:, None, None] + E, (32, 4, 4))
B_ROWS = np.broadcast_to(16 * J2 + 4 * T[:, None, None] + E, (32, 2, 4))
B_COLS = np.broadcast_to(G[:, None, None], (32, 2, 4))
I4 = np.arange(4)[None, :]
C_ROWS, C_COLS = G[:, None] + 8 * (I4 // 2), 2 * T[:, None] + I4 % 2


@pytest.fixture(scope="module")
def exe():
    return hip_cpu_program("mma_s8_emu_test", ["test/hip_cpu/mma_s8_emu_test.cu"], ["SPCONV_EMULATE_WMMA=1"])


def run(exe, tmp_path, a, b, c):
    """a [warps, 16, 32], b [warps, 32, 8] int8 values, c [warps, 16, 8] int32 -> D [warps, 16, 8]."""
    warps = a.shape[0]
    regs_a = np.stack([pack(a[w], A_ROWS, A_COLS) for w in range(warps)])
    regs_b = np.stack([pack(b[w], B_ROWS, B_COLS) for w in range(warps)])
    regs_c = np.stack([c[w][C_ROWS, C_COLS] for w in range(warps)]).astype(np.int32)
    with open(tmp_path / "in.bin", "wb") as f:
        for arr in (regs_a, regs_b, regs_c):
            arr.tofile(f)
    run_program(exe, 32 * warps, tmp_path / "in.bin", tmp_path / "out.bin")
    lanes = np.fromfile(tmp_path / "out.bin", dtype=np.int32).reshape(warps, 32, 4)
    d = np.zeros((warps, 16, 8), np.int64)
    for w in range(warps):
        d[w][C_ROWS, C_COLS] = lanes[w]
    return d


def test_lane_layout(exe, tmp_path):
    """Identity operands: D = A I' + C and D = I'' B + C read each operand's elements back through D."""
    a_unique = (np.arange(16 * 32).reshape(16, 32) % 251) - 125
    b_unique = (np.arange(32 * 8).reshape(32, 8) % 251) - 125
    sel_b = np.zeros((32, 8), np.int64)  # picks A's columns 4 n + 3 (spread over both K halves)
    sel_a = np.zeros((16, 32), np.int64)  # picks B's rows 2 m + 1
    for n in range(8):
        sel_b[4 * n + 3, n] = 1
    for m in range(16):
        sel_a[m, 2 * m + 1] = 1
    c = np.arange(128).reshape(16, 8) * 1000
    d = run(exe, tmp_path, np.stack([a_unique, sel_a]), np.stack([sel_b, b_unique]), np.stack([c, c]))
    np.testing.assert_array_equal(d[0], c + a_unique[:, 4 * np.arange(8) + 3])
    np.testing.assert_array_equal(d[1], c + b_unique[2 * np.arange(16) + 1, :])


def test_tile_product(exe, tmp_path):
    rng = np.random.default_rng(3)
    a = rng.integers(-128, 128, (3, 16, 32))
    b = rng.integers(-128, 128, (3, 32, 8))
    a[0] = -128
    b[0] = -128
    c = rng.integers(-10 ** 6, 10 ** 6, (3, 16, 8))
    d = run(exe, tmp_path, a, b, c)
    for w in range(3):
        np.testing.assert_array_equal(d[w], c[w] + a[w] @ b[w])
