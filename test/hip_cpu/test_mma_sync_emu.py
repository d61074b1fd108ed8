"""The sm_80 instruction emulators (csrc/hip/emu/mma_sync_emu.h, ldmatrix_emu.h, cp_async_emu.h, vote_emu.h via
tc_sm80.h).

Layouts stated here on their own, from the PTX ISA (lane l, g = l // 4, t = l % 4, low half of a .b32 first):
 - mma.m16n8k16 (fp16 / bf16): A reg j holds A[g + 8 (j % 2)][8 (j // 2) + 2 t + h], B reg j holds
   B[8 j + 2 t + h][g], C/D element i is C[g + 8 (i // 2)][2 t + i % 2];
 - ldmatrix m8n8: lanes 8 i .. 8 i + 7 address rows 0..7 of matrix i; register i of lane l holds
   M_i[g][2 t + h], or M_i[2 t + h][g] with .trans.
"""
import numpy as np
import pytest

from conftest import hip_cpu_program, run_program
from support.tiles import from_bits, random_bits, to_bits

pytestmark = pytest.mark.hip_cpu

L = np.arange(32)
G, T = L // 4, L % 4
H = np.arange(2)


@pytest.fixture(scope="module")
def exe():
    return hip_cpu_program("mma_sync_emu_test", ["test/hip_cpu/mma_sync_emu_test.cu"], ["SPCONV_EMULATE_SM80=1"])


def pack(bits, rows, cols):
    """Registers [32, n] from a 16-bit matrix: half h of register j of lane l is bits[rows[l, j, h], cols[l, j, h]]."""
    lo = bits[rows[:, :, 0], cols[:, :, 0]].astype(np.uint32)
    hi = bits[rows[:, :, 1], cols[:, :, 1]].astype(np.uint32)
    return lo | (hi << np.uint32(16))


J4, J2 = np.arange(4)[None, :, None], np.arange(2)[None, :, None]
A_ROWS = np.broadcast_to(G[:, None, None] + 8 * (J4 % 2), (32, 4, 2))
A_COLS = np.broadcast_to(8 * (J4 // 2) + 2 * T[:, None, None] + H, (32, 4, 2))
B_ROWS = np.broadcast_to(8 * J2 + 2 * T[:, None, None] + H, (32, 2, 2))
B_COLS = np.broadcast_to(G[:, None, None], (32, 2, 2))
I4 = np.arange(4)[None, :]
C_ROWS, C_COLS = G[:, None] + 8 * (I4 // 2), 2 * T[:, None] + I4 % 2


def run_mma(exe, tmp_path, dtype, a_bits, b_bits, c):
    """a_bits [warps, steps, 16, 16], b_bits [warps, steps, 16, 8] raw bits, c [warps, 16, 8] fp32 -> D."""
    warps, steps = a_bits.shape[:2]
    ra = np.stack([[pack(a_bits[w, s], A_ROWS, A_COLS) for s in range(steps)] for w in range(warps)])
    rb = np.stack([[pack(b_bits[w, s], B_ROWS, B_COLS) for s in range(steps)] for w in range(warps)])
    rc = np.stack([c[w][C_ROWS, C_COLS] for w in range(warps)]).astype(np.float32)
    with open(tmp_path / "in.bin", "wb") as f:
        for arr in (ra, rb, rc):
            arr.tofile(f)
    run_program(exe, "mma", dtype, warps, steps, tmp_path / "in.bin", tmp_path / "out.bin")
    lanes = np.fromfile(tmp_path / "out.bin", dtype=np.float32).reshape(warps, 32, 4)
    d = np.zeros((warps, 16, 8), np.float32)
    for w in range(warps):
        d[w][C_ROWS, C_COLS] = lanes[w]
    return d


def fma_chain(a, b, c):
    """c + sum_s a[s] @ b[s] as a chain of fp32 fused multiply-adds in (s, k) order (fp64 holds each exact
    product, and each sum closely enough that rounding it to fp32 is the fused result)."""
    d = np.asarray(c, dtype=np.float32).copy()
    with np.errstate(over="ignore", invalid="ignore"):
        for s in range(a.shape[0]):
            for k in range(a.shape[2]):
                prod = a[s, :, k, None].astype(np.float64) * b[s, None, k, :].astype(np.float64)
                d = (d.astype(np.float64) + prod).astype(np.float32)
    return d


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_lane_layout(exe, tmp_path, dtype):
    """Selector operands read each element of the other operand back through D, so a lane or register swap
    in the emulator (or in this test's layout) shows as a wrong element."""
    a_val = (np.arange(256).reshape(16, 16) % 61 - 30).astype(np.float32)
    b_val = (np.arange(128).reshape(16, 8) % 53 - 26).astype(np.float32)
    sel_b = np.zeros((16, 8), np.float32)  # D = A sel_b picks A's columns 2 n + 1 (both K halves)
    sel_a = np.zeros((16, 16), np.float32)  # D = sel_a B picks B's rows 15 - m
    for n in range(8):
        sel_b[2 * n + 1, n] = 1
    for m in range(16):
        sel_a[m, 15 - m] = 1
    c = np.arange(128, dtype=np.float32).reshape(16, 8) * 1000
    a_bits = to_bits(np.stack([a_val, sel_a]), dtype)[:, None]
    b_bits = to_bits(np.stack([sel_b, b_val]), dtype)[:, None]
    d = run_mma(exe, tmp_path, dtype, a_bits, b_bits, np.stack([c, c]))
    np.testing.assert_array_equal(d[0], c + a_val[:, 2 * np.arange(8) + 1])
    np.testing.assert_array_equal(d[1], c + b_val[15 - np.arange(16), :])


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("steps", [1, 4])
def test_mma_random(exe, tmp_path, dtype, steps):
    rng = np.random.default_rng(11 + steps)
    warps = 3
    a_bits = random_bits(rng, dtype, (warps, steps, 16, 16))
    b_bits = random_bits(rng, dtype, (warps, steps, 16, 8))
    c = rng.standard_normal((warps, 16, 8)).astype(np.float32)
    d = run_mma(exe, tmp_path, dtype, a_bits, b_bits, c)
    for w in range(warps):
        a, b = from_bits(a_bits[w], dtype), from_bits(b_bits[w], dtype)
        np.testing.assert_array_equal(d[w].view(np.uint32), fma_chain(a, b, c[w]).view(np.uint32))
        ref = c[w].astype(np.float64) + np.einsum("sik,skj->ij", a.astype(np.float64), b.astype(np.float64))
        np.testing.assert_allclose(d[w], ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", ["f16", "bf16"])
def test_mma_special_values(exe, tmp_path, dtype):
    """Inf, NaN, signed zeros, the largest finite values (bf16 products overflow fp32) and a cancellation
    that only the k order decides."""
    rng = np.random.default_rng(5)
    big = 65504.0 if dtype == "f16" else 3.0e38
    pool = np.array([np.inf, -np.inf, np.nan, 0.0, -0.0, big, -big, 1.0, -1.0, 2.0 ** -14, 0.5], np.float32)
    a = rng.choice(pool, (2, 1, 16, 16)).astype(np.float32)
    b = rng.choice(pool, (2, 1, 16, 8)).astype(np.float32)
    a[1, 0] = 0.0
    b[1, 0] = 0.0
    a[1, 0, :, 0], b[1, 0, 0, :] = 4096.0, 4096.0  # 2^24 ...
    a[1, 0, :, 1], b[1, 0, 1, :] = 1.0, 0.5        # ... + 0.5: lost only if added after the cancellation
    a[1, 0, :, 2], b[1, 0, 2, :] = -4096.0, 4096.0
    c = np.zeros((2, 16, 8), np.float32)
    c[0] = rng.choice(np.array([0.0, -0.0, 1.0, np.inf], np.float32), (16, 8))
    c[1] = -0.0
    d = run_mma(exe, tmp_path, dtype, to_bits(a, dtype), to_bits(b, dtype), c)
    for w in range(2):
        ref = fma_chain(a[w], b[w], c[w])
        np.testing.assert_array_equal(d[w], ref)
        assert np.isnan(ref).any() == (w == 0)
        num = ~np.isnan(ref)  # a NaN's sign is the host's choice
        np.testing.assert_array_equal(np.signbit(d[w][num]), np.signbit(ref[num]))
    assert (d[1] == 0.0).all()  # (2^24 + 0.5) rounds to 2^24 in fp32, then cancels


def run_ldmatrix(exe, tmp_path, n, trans, rows, index):
    warps = rows.shape[0]
    with open(tmp_path / "in.bin", "wb") as f:
        rows.astype(np.uint16).tofile(f)
        index.astype(np.int32).tofile(f)
    run_program(exe, "ldmatrix", n, int(trans), warps, rows.shape[1], tmp_path / "in.bin", tmp_path / "out.bin")
    return np.fromfile(tmp_path / "out.bin", dtype=np.uint32).reshape(warps, 32, n)


@pytest.mark.parametrize("n", [1, 2, 4])
@pytest.mark.parametrize("trans", [False, True])
def test_ldmatrix(exe, tmp_path, n, trans):
    """Rows scattered over shared memory in a random order per warp; lanes past 8 n give an unusable address."""
    rng = np.random.default_rng(n * 2 + trans)
    warps, nrows = 2, 48
    rows = rng.integers(0, 1 << 16, (warps, nrows, 8))
    index = np.full((warps, 32), -1)
    for w in range(warps):
        index[w, :8 * n] = rng.permutation(nrows)[:8 * n]
    regs = run_ldmatrix(exe, tmp_path, n, trans, rows, index)
    for w in range(warps):
        for i in range(n):
            m = rows[w][index[w, 8 * i:8 * i + 8]]  # matrix i: [row][col]
            if trans:
                lo, hi = m[2 * T, G], m[2 * T + 1, G]
            else:
                lo, hi = m[G, 2 * T], m[G, 2 * T + 1]
            np.testing.assert_array_equal(regs[w, :, i], lo.astype(np.uint32) | (hi.astype(np.uint32) << 16))


def test_ldmatrix_feeds_mma(exe, tmp_path):
    """ldmatrix.x4 of a row-major 16x16 A tile (matrices: rows 0-7 / 8-15 x cols 0-7 / 8-15, in the order of
    A's registers) gives exactly the mma A fragment; .x2.trans of a row-major 16x8 B ([k][n]) the B fragment."""
    rng = np.random.default_rng(9)
    a = rng.integers(0, 1 << 16, (16, 16))
    b = rng.integers(0, 1 << 16, (16, 8))
    # Row r of A's half c is memory row 2 r + c; B's row k is memory row 32 + k.
    mem = np.zeros((1, 48, 8), np.int64)
    for r in range(16):
        mem[0, 2 * r], mem[0, 2 * r + 1] = a[r, :8], a[r, 8:]
    mem[0, 32:48] = b
    r8 = np.arange(8)
    idx_a = np.concatenate([2 * r8, 2 * (r8 + 8), 2 * r8 + 1, 2 * (r8 + 8) + 1])[None]
    np.testing.assert_array_equal(run_ldmatrix(exe, tmp_path, 4, False, mem, idx_a)[0], pack(a, A_ROWS, A_COLS))
    idx_b = np.full((1, 32), -1)
    idx_b[0, :16] = 32 + np.arange(16)
    np.testing.assert_array_equal(run_ldmatrix(exe, tmp_path, 2, True, mem, idx_b)[0], pack(b, B_ROWS, B_COLS))


POISON = 0xFFFFFFFF


def test_cp_async_groups(exe, tmp_path):
    """Each destination holds the 0xff pattern until the wait covering its group, then the data (zero-filled
    past src-size); uncommitted copies wait for wait_all; after a barrier other threads see the data."""
    n = 64
    rng = np.random.default_rng(2)
    src0 = rng.integers(0, POISON, (n, 4), dtype=np.uint32)
    src1 = rng.integers(0, POISON, (n, 2), dtype=np.uint32)
    with open(tmp_path / "in.bin", "wb") as f:
        src0.tofile(f)
        src1.tofile(f)
    run_program(exe, "cp_async_groups", n, tmp_path / "in.bin", tmp_path / "out.bin")
    rec = np.fromfile(tmp_path / "out.bin", dtype=np.uint32).reshape(n, 5, 7)
    p4, p2 = np.full((n, 4), POISON), np.full((n, 2), POISON)
    s1 = np.stack([src1[:, 0], np.zeros(n, np.uint32)], axis=1)  # src-size 4 of 8: upper word zero
    expect = {
        0: (p4, p2, POISON),   # issued: nothing landed
        1: (src0, p2, POISON),  # wait_group 1: the older group
        2: (src0, s1, POISON),  # wait_group 0: both committed groups, not the uncommitted copy
        3: (src0, s1, 0),       # wait_all: src-size 0, all zero
        4: (np.roll(src0, -1, axis=0), s1, 0),
    }
    for step, (w0, w1, w2) in expect.items():
        np.testing.assert_array_equal(rec[:, step, :4], w0, err_msg="step %d" % step)
        np.testing.assert_array_equal(rec[:, step, 4:6], w1, err_msg="step %d" % step)
        np.testing.assert_array_equal(rec[:, step, 6], np.full(n, w2), err_msg="step %d" % step)


@pytest.mark.parametrize("lag,barrier,right", [(1, 1, True), (0, 1, True), (2, 1, False), (1, 0, False)])
def test_cp_async_pipeline_needs_wait_and_barrier(exe, tmp_path, lag, barrier, right):
    """A 3-stage ring: with the right wait (all but the newest group) and a barrier the sums are right; one
    group too few waited for, or no barrier, gives wrong sums."""
    n, chunks = 64, 7
    rng = np.random.default_rng(4)
    src = rng.integers(0, 1 << 20, (chunks, n * 4), dtype=np.uint32)
    src.tofile(tmp_path / "in.bin")
    run_program(exe, "cp_async_ring", n, chunks, lag, barrier, tmp_path / "in.bin", tmp_path / "out.bin")
    got = np.fromfile(tmp_path / "out.bin", dtype=np.uint64)
    want = src[:, (4 * np.arange(n) + 5) % (4 * n)].astype(np.uint64).sum(axis=0)
    if right:
        np.testing.assert_array_equal(got, want)
    else:
        assert (got != want).sum() >= n // 2, "a missing wait or barrier went unnoticed"


@pytest.mark.parametrize("what,message", [(0, "aligned"), (1, "aligned"), (2, "src-size")])
def test_cp_async_checks(exe, what, message):
    r = run_program(exe, "cp_async_bad", what, expect_ok=False)
    assert r.returncode != 0 and message in r.stderr


def test_vote_any(exe, tmp_path):
    """vote.sync.any over each warp of 32 lanes (the runtime's own wavefront is 64 wide): warps with no lane, one
    lane (the first, the last, in between), several and every lane set; each lane receives its warp's answer."""
    rng = np.random.default_rng(5)
    p = np.zeros((8, 32), dtype=np.int32)
    p[1, 0] = 1
    p[2, 31] = 1
    p[3, 17] = 7
    p[4] = rng.integers(0, 2, 32)
    p[5] = 1
    p[7, 3] = -1
    p.tofile(tmp_path / "in.bin")
    run_program(exe, "vote", 8, tmp_path / "in.bin", tmp_path / "out.bin")
    got = np.fromfile(tmp_path / "out.bin", dtype=np.int32).reshape(8, 32)
    want = np.broadcast_to((p != 0).any(axis=1)[:, None], (8, 32)).astype(np.int32)
    np.testing.assert_array_equal(got, want)
