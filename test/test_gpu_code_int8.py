"""The int8 GPU code on the CPU (HIP CPU runtime): quantized_conv (csrc/hip/quantized_conv.cu,
csrc/ops/gpu/quantized_gpu.cpp) bit for bit against the plain integer reference over channel tails, kernel
volumes, repeated table rounds, every epilogue option and extreme values; map_info without a host copy; bad
tables refused; int8 max pooling equal to the CPU route's float max pooling of the same values. Small sizes:
every GPU thread is a fiber here."""
import pytest
import torch

from spconv import _backend
from conftest import hip_cpu_library
from support.int8_reference import int8_conv_reference, random_table
from support.sites import coords
from test_hip_cpu_host_syncs import SYNCING_OPS

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _int8(shape, g, lo=-128, hi=127):
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32).to(torch.int8)


def _case(cin, cout, kvol, rounds=1, n_in=23, n_out=37, seed=0, fill=0.5, bias=True, residual=True):
    """Operands of one call; scale brings the sums into the int8 range (so rounding and clamping both occur)."""
    g = _gen(seed)
    x, w = _int8((n_in, cin), g), _int8((kvol, cin, cout), g)
    nbr = random_table(n_in, n_out, kvol, rounds, fill, g)
    spread = 127.0 * 128.0 * max(1.0, (kvol * rounds * fill * max(cin, 1)) ** 0.5)
    scale = (torch.rand(cout, generator=g) * 4 + 0.5) * 40.0 / spread
    b = (torch.rand(cout, generator=g) - 0.5) * 60 if bias else None
    r = _int8((n_out, cout), g) if residual else None
    return x, w, nbr, scale.float(), None if b is None else b.float(), r


def _check(ops, x, w, nbr, scale, bias, res, rs=0.37, act=0, alpha=0.1, info=None):
    want = int8_conv_reference(x, w, nbr, scale, bias, res, rs, act, alpha)
    got = ops.quantized_conv(x, w, nbr, scale, bias, res, rs, act, alpha, info)
    assert got.dtype == torch.int8 and got.shape == want.shape
    diff = int((got != want).sum())
    assert diff == 0, "%d of %d outputs differ" % (diff, want.numel())
    return got


# (cin, cout, kvol, rounds): channel tails on both sides (1, 3, 17), several K steps (96, 128: 24 and 32 words),
# several channel tiles (96, 128), offsets 1 / 8 / 27, one and two table rounds.
SHAPES = [(1, 1, 1, 1), (3, 16, 27, 1), (16, 3, 8, 2), (17, 17, 27, 1), (32, 64, 8, 1), (64, 32, 27, 2),
          (96, 128, 1, 2), (128, 96, 8, 1), (3, 128, 27, 2), (128, 1, 1, 1)]


@pytest.mark.parametrize("cin,cout,kvol,rounds", SHAPES)
def test_shapes_match_reference(hip_cpu, cin, cout, kvol, rounds):
    _check(hip_cpu, *_case(cin, cout, kvol, rounds, seed=cin * 7 + cout))


@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True), (True, True)])
def test_epilogue_options(hip_cpu, act, bias, residual):
    args = _case(17, 20, 8, 1, seed=3 + act, bias=bias, residual=residual)
    _check(hip_cpu, *args, rs=0.61, act=act, alpha=0.125 if act == 2 else 0.3)


def test_ties_round_to_even(hip_cpu):
    """scale 0.5 (and bias 0.5) put most values exactly halfway between two integers."""
    x, w, nbr, _, _, _ = _case(4, 9, 1, 1, seed=11)
    x, w = (x.to(torch.int32) % 5 - 2).to(torch.int8), (w.to(torch.int32) % 5 - 2).to(torch.int8)
    got = _check(hip_cpu, x, w, nbr, torch.full((9,), 0.5), None, None)
    _check(hip_cpu, x, w, nbr, torch.full((9,), 1.0), torch.full((9,), 0.5), None)
    assert got.abs().max() <= 20  # small sums: the ties were not clamped away


def test_extreme_values(hip_cpu):
    """-128 * -128 everywhere: large exact sums, then the clamp at both ends; 127 * -128 the other sign."""
    kvol, cin, cout, n = 27, 64, 5, 9
    nbr = random_table(n, n, kvol, 2, 0.9, _gen(5))
    x = torch.full((n, cin), -128, dtype=torch.int8)
    w = torch.full((kvol, cin, cout), -128, dtype=torch.int8)
    scale = torch.tensor([1e-9, 1e-7, 1e-6, 1.0, -1.0])
    _check(hip_cpu, x, w, nbr, scale, None, torch.full((n, cout), 127, dtype=torch.int8), rs=1.0)
    _check(hip_cpu, x, torch.full_like(w, 127), nbr, scale, torch.full((cout,), -3.0), None, act=2, alpha=0.5)


def test_largest_exact_sum(hip_cpu):
    """T * Cin just under the schema's 2^17 bound with every product +-2^14: sums just inside int32 (a wrapped
    sum would come out negative); one column more is refused."""
    cin, t = 128, 1023
    x = torch.full((1, cin), -128, dtype=torch.int8)
    w = torch.full((t, cin, 2), -128, dtype=torch.int8)
    w[:, :, 1] = 127
    nbr = torch.zeros(2, t, dtype=torch.int32)
    _check(hip_cpu, x, w, nbr, torch.tensor([2.0 ** -24, 2.0 ** -24]), None, None)
    with pytest.raises(ValueError, match="exceeds"):
        hip_cpu.quantized_conv(x, torch.zeros(t + 1, cin, 2, dtype=torch.int8), torch.zeros(2, t + 1, dtype=torch.int32),
                               torch.ones(2), None, None, 1.0, 0, 0.0)


def test_large_kernel_volume(hip_cpu):
    _check(hip_cpu, *_case(3, 2, 4096, 1, n_in=40, n_out=5, seed=2, fill=0.3))


def test_empty(hip_cpu):
    x, w, nbr, scale, bias, _ = _case(5, 6, 8, 1, seed=1)
    got = hip_cpu.quantized_conv(x, w, nbr[:0], scale, bias, None, 1.0, 1, 0.0)
    assert got.shape == (0, 6) and got.dtype == torch.int8
    # no input rows: every entry -1, the output is the epilogue of a zero sum (bias, residual)
    empty_in = torch.full((4, 8), -1, dtype=torch.int32)
    _check(hip_cpu, x[:0], w, empty_in, scale, bias, _int8((4, 6), _gen(9)))


def test_map_info_no_host_copy(hip_cpu):
    shape = [7, 6, 5]
    idx = coords(shape, 1, 60, seed=4)
    _, _, _, _, info, table = hip_cpu.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3,
                                                       True, False)
    g = _gen(6)
    x, w = _int8((idx.shape[0], 12), g), _int8((27, 12, 10), g)
    scale, bias = torch.full((10,), 3e-4), torch.zeros(10)
    before = _backend.debug_library(hip_cpu).host_copy_count()
    with torch.profiler.profile() as prof:
        got = hip_cpu.quantized_conv(x, w, table, scale, bias, None, 1.0, 1, 0.0, info)
    assert _backend.debug_library(hip_cpu).host_copy_count() == before
    syncing = sorted({e.name for e in prof.events()} & SYNCING_OPS)
    assert not syncing, syncing  # nothing that would wait for a GPU
    _check(hip_cpu, x, w, table, scale, bias, None, act=1, info=info)
    assert torch.equal(hip_cpu.quantized_conv(x, w, table, scale, bias, None, 1.0, 1, 0.0), got)
    assert _backend.debug_library(hip_cpu).host_copy_count() == before + 1  # without map_info: the table's extremes
    with pytest.raises(ValueError, match="map_info says"):
        hip_cpu.quantized_conv(x[:-1], w, table, scale, bias, None, 1.0, 1, 0.0, info)


def test_bad_input_raises(hip_cpu):
    x, w, nbr, scale, bias, res = _case(8, 4, 8, 1, seed=7)
    for bad_value in (x.shape[0], -2):
        bad = nbr.clone()
        bad[3, 5] = bad_value
        with pytest.raises(ValueError, match="nbr entries must be -1 or an input row"):
            hip_cpu.quantized_conv(x, w, bad, scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(TypeError, match="features must be int8"):
        hip_cpu.quantized_conv(x.float(), w, nbr, scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="multiple of the kernel volume"):
        hip_cpu.quantized_conv(x, w, nbr[:, :5], scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="activation"):
        hip_cpu.quantized_conv(x, w, nbr, scale, bias, res, 1.0, 3, 0.0)


def test_path_names_the_body(hip_cpu):
    assert hip_cpu.quantized_conv_path(torch.zeros(1, 4, dtype=torch.int8)) == "simt"


# The emulated matrix-core bodies: int8 MFMA (the gfx90a code) in the mfma variant, integer mma.sync (the NVIDIA
# sm_80+ code) in the wmma variant. Partial word groups (cin 3, 17: one and five words; 40: ten), several K steps
# and channel tiles, both table rounds, the epilogue options.
MATRIX_BODIES = {"mfma": "mfma_i8", "wmma": "mma_s8"}


@pytest.mark.slow
@pytest.mark.parametrize("variant", sorted(MATRIX_BODIES))
@pytest.mark.parametrize("cin,cout,kvol,rounds,act", [(3, 16, 27, 1, 0), (17, 17, 27, 1, 2), (64, 32, 27, 2, 1),
                                                      (40, 72, 8, 1, 0), (96, 128, 1, 2, 0), (128, 1, 1, 1, 2)])
def test_matrix_body_matches_reference(variant, cin, cout, kvol, rounds, act):
    ops = hip_cpu_library(variant)
    assert ops.quantized_conv_path(torch.zeros(1, 4, dtype=torch.int8)) == MATRIX_BODIES[variant]
    _check(ops, *_case(cin, cout, kvol, rounds, seed=cin * 7 + cout), act=act)


@pytest.mark.parametrize("subm", [False, True])
def test_int8_maxpool_matches_cpu_float(hip_cpu, subm):
    shape = [8, 7, 6]
    idx = coords(shape, 2, 90, seed=8)
    ks, st, pad = ([3] * 3, [1] * 3, [1] * 3) if subm else ([2] * 3, [2] * 3, [0] * 3)
    out_shape = shape if subm else [4, 4, 3]
    out_idx, pin, pout, poff, info, _ = cpu.get_indice_pairs(idx, 2, shape, out_shape, ks, st, pad, [1] * 3, subm,
                                                             False)
    x = _int8((idx.shape[0], 19), _gen(10))
    x[:, 0] = -5  # a channel whose windows are all negative: the outputs start at 0
    n_out = out_idx.shape[0]
    want = cpu.indice_maxpool(x.float(), pin, pout, poff, n_out)
    before = _backend.debug_library(hip_cpu).host_copy_count()
    got = hip_cpu.indice_maxpool(x, pin, pout, poff, n_out, info)
    assert _backend.debug_library(hip_cpu).host_copy_count() == before
    assert got.dtype == torch.int8 and torch.equal(got.float(), want)
    assert torch.equal(got[:, 0], torch.zeros(n_out, dtype=torch.int8))
    assert torch.equal(hip_cpu.indice_maxpool(x, pin, pout, poff, n_out), got)  # checked on the device
