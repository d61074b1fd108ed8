"""The int8 GPU code (csrc/hip/quantized_conv.cu, csrc/ops/gpu/quantized_gpu.cpp) wherever it runs (``gpu_place``:
the HIP CPU build, and a GPU when there is one): quantized_conv bit for bit against the plain integer reference
and the CPU op over channel tails, kernel volumes, repeated table rounds, every epilogue option and extreme values;
map_info without a host copy; bad tables refused; the body named by quantized_conv_path; int8 max pooling equal
to the CPU route's float max pooling of the same values. The HIP CPU build takes small sizes (every GPU thread is
a fiber there); a GPU adds larger ones. Only on the HIP CPU build: the emulated matrix-core bodies (the
tools/hip_cpu_build.py variants)."""
import pytest
import torch

from spconv import _backend
from conftest import hip_cpu_library
from support.int8_reference import int8_conv_reference, random_table
from support.launch_counts import SYNCING_OPS
from support.places import Place, per_place
from support.sites import coords

cpu = torch.ops.spconv


def _gen(seed):
    return torch.Generator().manual_seed(seed)


def _int8(shape, g, lo=-128, hi=127):
    return torch.randint(lo, hi + 1, shape, generator=g, dtype=torch.int32).to(torch.int8)


def _case(cin, cout, kvol, rounds=1, n_in=23, n_out=37, seed=0, fill=0.5, bias=True, residual=True):
    """Operands of one call on the CPU; scale brings the sums into the int8 range (so rounding and clamping both
    occur)."""
    g = _gen(seed)
    x, w = _int8((n_in, cin), g), _int8((kvol, cin, cout), g)
    nbr = random_table(n_in, n_out, kvol, rounds, fill, g)
    spread = 127.0 * 128.0 * max(1.0, (kvol * rounds * fill * max(cin, 1)) ** 0.5)
    scale = (torch.rand(cout, generator=g) * 4 + 0.5) * 40.0 / spread
    b = (torch.rand(cout, generator=g) - 0.5) * 60 if bias else None
    r = _int8((n_out, cout), g) if residual else None
    return x, w, nbr, scale.float(), None if b is None else b.float(), r


def _on(place, t):
    return None if t is None else place.to(t)


def _check(place, x, w, nbr, scale, bias, res, rs=0.37, act=0, alpha=0.1, info=None):
    """quantized_conv at the place (map_info stays on the host) against the integer reference; the result on the
    CPU."""
    cpu_args = [None if t is None else t.cpu() for t in (x, w, nbr, scale, bias, res)]
    want = int8_conv_reference(*cpu_args, rs, act, alpha)
    got = place.ops.quantized_conv(*(_on(place, t) for t in (x, w, nbr, scale, bias, res)), rs, act, alpha, info)
    assert got.dtype == torch.int8 and got.shape == want.shape
    got = got.cpu()
    diff = int((got != want).sum())
    assert diff == 0, "%d of %d outputs differ" % (diff, want.numel())
    return got


# (cin, cout, kvol, rounds): channel tails on both sides (1, 3, 17), several K steps (96, 128: 24 and 32 words),
# several channel tiles (96, 128), offsets 1 / 8 / 27, one and two table rounds.
SHAPES = [(1, 1, 1, 1), (3, 16, 27, 1), (16, 3, 8, 2), (17, 17, 27, 1), (32, 64, 8, 1), (64, 32, 27, 2),
          (96, 128, 1, 2), (128, 96, 8, 1), (3, 128, 27, 2), (128, 1, 1, 1)]
# A GPU: wider channels and more rows, every activation.
GPU_SHAPES = [(1, 1, 1, 1), (3, 16, 27, 1), (17, 33, 27, 2), (64, 64, 27, 1), (96, 128, 8, 2), (128, 200, 27, 1),
              (256, 256, 1, 1)]
ROWS = {"hip_cpu": (23, 37), "cuda": (300, 400)}  # (n_in, n_out)


@per_place("cin,cout,kvol,rounds,act", {"hip_cpu": [s + (0,) for s in SHAPES],
                                        "cuda": [s + (act,) for s in GPU_SHAPES for act in (0, 1, 2)]},
           ids=lambda *v: "-".join(map(str, v[:4])) + ("" if v[4] == 0 else "-act%d" % v[4]))
def test_shapes_match_reference(gpu_place, cin, cout, kvol, rounds, act):
    n_in, n_out = ROWS[gpu_place.name]
    args = _case(cin, cout, kvol, rounds, n_in=n_in, n_out=n_out, seed=cin * 7 + cout + act)
    got = _check(gpu_place, *args, act=act)
    assert torch.equal(cpu.quantized_conv(*args, 0.37, act, 0.1), got)  # the CPU op, the same bits


@pytest.mark.parametrize("act", [0, 1, 2])
@pytest.mark.parametrize("bias,residual", [(False, False), (True, False), (False, True), (True, True)])
def test_epilogue_options(gpu_place, act, bias, residual):
    args = _case(17, 20, 8, 1, seed=3 + act, bias=bias, residual=residual)
    _check(gpu_place, *args, rs=0.61, act=act, alpha=0.125 if act == 2 else 0.3)


def test_ties_round_to_even(gpu_place):
    """scale 0.5 (and bias 0.5) put most values exactly halfway between two integers."""
    x, w, nbr, _, _, _ = _case(4, 9, 1, 1, seed=11)
    x, w = (x.to(torch.int32) % 5 - 2).to(torch.int8), (w.to(torch.int32) % 5 - 2).to(torch.int8)
    got = _check(gpu_place, x, w, nbr, torch.full((9,), 0.5), None, None)
    _check(gpu_place, x, w, nbr, torch.full((9,), 1.0), torch.full((9,), 0.5), None)
    assert got.abs().max() <= 20  # small sums: the ties were not clamped away


def test_extreme_values(gpu_place):
    """-128 * -128 everywhere: large exact sums, then the clamp at both ends; 127 * -128 the other sign."""
    kvol, cin, cout, n = 27, 64, 5, 9
    nbr = random_table(n, n, kvol, 2, 0.9, _gen(5))
    x = torch.full((n, cin), -128, dtype=torch.int8)
    w = torch.full((kvol, cin, cout), -128, dtype=torch.int8)
    scale = torch.tensor([1e-9, 1e-7, 1e-6, 1.0, -1.0])
    _check(gpu_place, x, w, nbr, scale, None, torch.full((n, cout), 127, dtype=torch.int8), rs=1.0)
    _check(gpu_place, x, torch.full_like(w, 127), nbr, scale, torch.full((cout,), -3.0), None, act=2, alpha=0.5)


def test_largest_exact_sum(gpu_place):
    """T * Cin just under the schema's 2^17 bound with every product +-2^14: sums just inside int32 (a wrapped
    sum would come out negative); one column more is refused."""
    cin, t = 128, 1023
    x = torch.full((1, cin), -128, dtype=torch.int8)
    w = torch.full((t, cin, 2), -128, dtype=torch.int8)
    w[:, :, 1] = 127
    nbr = torch.zeros(2, t, dtype=torch.int32)
    _check(gpu_place, x, w, nbr, torch.tensor([2.0 ** -24, 2.0 ** -24]), None, None)
    on = gpu_place.to
    with pytest.raises(ValueError, match="exceeds"):
        gpu_place.ops.quantized_conv(on(x), on(torch.zeros(t + 1, cin, 2, dtype=torch.int8)),
                                     on(torch.zeros(2, t + 1, dtype=torch.int32)), on(torch.ones(2)), None, None, 1.0,
                                     0, 0.0)


def test_large_kernel_volume(gpu_place):
    _check(gpu_place, *_case(3, 2, 4096, 1, n_in=40, n_out=5, seed=2, fill=0.3))


def test_empty(gpu_place):
    x, w, nbr, scale, bias, _ = _case(5, 6, 8, 1, seed=1)
    on = gpu_place.to
    got = gpu_place.ops.quantized_conv(on(x), on(w), on(nbr[:0]), on(scale), on(bias), None, 1.0, 1, 0.0)
    assert got.shape == (0, 6) and got.dtype == torch.int8
    # no input rows: every entry -1, the output is the epilogue of a zero sum (bias, residual)
    empty_in = torch.full((4, 8), -1, dtype=torch.int32)
    _check(gpu_place, x[:0], w, empty_in, scale, bias, _int8((4, 6), _gen(9)))


# The HIP CPU build's work grows with the rows (every GPU thread a fiber): this size on a GPU alone.
@per_place("n_in,n_out", {"cuda": [(20000, 30000)]}, ids=lambda n_in, n_out: "%dx%d" % (n_in, n_out))
def test_large_and_run_to_run(gpu_place, n_in, n_out):
    x, w, nbr, scale, bias, _ = _case(64, 96, 27, 1, n_in=n_in, n_out=n_out, seed=5)
    got = _check(gpu_place, x, w, nbr, scale, bias, None, rs=1.0, act=1, alpha=0.0)
    on = gpu_place.to
    again = gpu_place.ops.quantized_conv(on(x), on(w), on(nbr), on(scale), on(bias), None, 1.0, 1, 0.0)
    assert torch.equal(again.cpu(), got)  # run to run


MAP_SIZES = {"hip_cpu": ([7, 6, 5], 60), "cuda": ([20, 20, 20], 2000)}  # (grid, voxels)


def test_map_info_no_host_copy(gpu_place):
    shape, n = MAP_SIZES[gpu_place.name]
    idx = gpu_place.to(coords(shape, 1, n, seed=4))
    ops = gpu_place.ops
    _, _, _, _, info, table = ops.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True,
                                                   False)
    g = _gen(6)
    x, w = _int8((idx.shape[0], 12), g), _int8((27, 12, 10), g)
    scale, bias = torch.full((10,), 3e-4), torch.zeros(10)
    on = gpu_place.to
    debug = _backend.debug_library(ops)
    before = debug.host_copy_count()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        got = ops.quantized_conv(on(x), on(w), table, on(scale), on(bias), None, 1.0, 1, 0.0, info)
    assert debug.host_copy_count() == before
    syncing = sorted({e.name for e in prof.events()} & SYNCING_OPS)
    assert not syncing, syncing  # nothing that would wait for a GPU
    _check(gpu_place, x, w, table, scale, bias, None, act=1, info=info)
    assert torch.equal(ops.quantized_conv(on(x), on(w), table, on(scale), on(bias), None, 1.0, 1, 0.0), got)
    assert debug.host_copy_count() == before + 1  # without map_info: the table's extremes
    with pytest.raises(ValueError, match="map_info says"):
        ops.quantized_conv(on(x[:-1]), on(w), table, on(scale), on(bias), None, 1.0, 1, 0.0, info)


def test_bad_input_raises(gpu_place):
    x, w, nbr, scale, bias, res = (gpu_place.to(t) for t in _case(8, 4, 8, 1, seed=7))
    ops = gpu_place.ops
    for bad_value in (x.shape[0], -2):
        bad = nbr.clone()
        bad[3, 5] = bad_value
        with pytest.raises(ValueError, match="nbr entries must be -1 or an input row"):
            ops.quantized_conv(x, w, bad, scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(TypeError, match="features must be int8"):
        ops.quantized_conv(x.float(), w, nbr, scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="multiple of the kernel volume"):
        ops.quantized_conv(x, w, nbr[:, :5], scale, bias, res, 1.0, 0, 0.0)
    with pytest.raises(ValueError, match="activation"):
        ops.quantized_conv(x, w, nbr, scale, bias, res, 1.0, 3, 0.0)


def test_path_names_the_body(gpu_place):
    name = gpu_place.ops.quantized_conv_path(torch.zeros(1, 4, dtype=torch.int8, device=gpu_place.device))
    if gpu_place.name == "hip_cpu":
        assert name == "simt"
        return
    assert name in {"sdot4", "dp4a", "mfma_i8", "mma_s8", "simt"}
    if torch.version.cuda is not None:  # integer MMA from sm_80, dp4a from sm_61
        cap = torch.cuda.get_device_capability()
        assert name == ("mma_s8" if cap >= (8, 0) else "dp4a" if cap >= (6, 1) else "simt")
    elif torch.version.hip is not None:
        arch = torch.cuda.get_device_properties(0).gcnArchName.split(":")[0]
        want = {"gfx906": "sdot4", "gfx908": "sdot4", "gfx90a": "mfma_i8", "gfx940": "mfma_i8", "gfx941": "mfma_i8",
                "gfx942": "mfma_i8"}
        assert name == want.get(arch, "simt"), arch


# The emulated matrix-core bodies (the HIP CPU build's variants alone; a GPU runs its own body in the tests
# above): int8 MFMA (the gfx90a code) in the mfma variant, integer mma.sync (the NVIDIA sm_80+ code) in the wmma
# variant. Partial word groups (cin 3, 17: one and five words; 40: ten), several K steps and channel tiles, both
# table rounds, the epilogue options.
MATRIX_BODIES = {"mfma": "mfma_i8", "wmma": "mma_s8"}


@pytest.mark.slow
@pytest.mark.hip_cpu
@pytest.mark.parametrize("variant", sorted(MATRIX_BODIES))
@pytest.mark.parametrize("cin,cout,kvol,rounds,act", [(3, 16, 27, 1, 0), (17, 17, 27, 1, 2), (64, 32, 27, 2, 1),
                                                      (40, 72, 8, 1, 0), (96, 128, 1, 2, 0), (128, 1, 1, 1, 2)])
def test_matrix_body_matches_reference(variant, cin, cout, kvol, rounds, act):
    ops = hip_cpu_library(variant)
    assert ops.quantized_conv_path(torch.zeros(1, 4, dtype=torch.int8)) == MATRIX_BODIES[variant]
    _check(Place("hip_cpu", ops), *_case(cin, cout, kvol, rounds, seed=cin * 7 + cout), act=act)


# (grid, voxels, channels, the strided pool's output grid)
POOL_SIZES = {"hip_cpu": ([8, 7, 6], 90, 19, [4, 4, 3]), "cuda": ([16, 16, 16], 1500, 35, [8, 8, 8])}


@pytest.mark.parametrize("subm", [False, True])
def test_int8_maxpool_matches_cpu_float(gpu_place, subm):
    shape, n, channels, pooled = POOL_SIZES[gpu_place.name]
    idx = coords(shape, 2, n, seed=8)
    ks, st, pad = ([3] * 3, [1] * 3, [1] * 3) if subm else ([2] * 3, [2] * 3, [0] * 3)
    out_shape = shape if subm else pooled
    out_idx, pin, pout, poff, info, _ = cpu.get_indice_pairs(idx, 2, shape, out_shape, ks, st, pad, [1] * 3, subm,
                                                             False)
    x = _int8((idx.shape[0], channels), _gen(10))
    x[:, 0] = -5  # a channel whose windows are all negative: the outputs start at 0
    n_out = out_idx.shape[0]
    want = cpu.indice_maxpool(x.float(), pin, pout, poff, n_out)
    ops, on = gpu_place.ops, gpu_place.to
    debug = _backend.debug_library(ops)
    before = debug.host_copy_count()
    got = ops.indice_maxpool(on(x), on(pin), on(pout), on(poff), n_out, info)
    assert debug.host_copy_count() == before
    got = got.cpu()
    assert got.dtype == torch.int8 and torch.equal(got.float(), want)
    assert torch.equal(got[:, 0], torch.zeros(n_out, dtype=torch.int8))
    assert torch.equal(ops.indice_maxpool(on(x), on(pin), on(pout), on(poff), n_out).cpu(), got)  # checked there
