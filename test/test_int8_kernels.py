"""The CPU int8 kernels: quantized_conv equals the plain integer reference (test/support/int8_reference.py) bit for bit
on every instruction-set body and thread count, refuses bad arguments with an exception naming them, and
indice_maxpool on int8 features equals the float max pool over the same map."""
import os
import subprocess
import sys

import pytest
import torch

import spconv.pytorch  # noqa: F401  (loads the op library and the ops' fake kernels)
from spconv import _backend
from spconv.pytorch.ops import get_conv_output_size
from support.int8_cases import SHAPES, int8_operands, special_operands
from support.int8_reference import int8_conv_reference, random_table

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OPS = torch.ops.spconv


def _both(x, w, nbr, scale, bias, res, rs=0.37, act=0, alpha=0.1, map_info=None):
    y = OPS.quantized_conv(x, w, nbr, scale, bias, res, rs, act, alpha, map_info)
    ref = int8_conv_reference(x, w, nbr, scale, bias, res, rs, act, alpha)
    return y, ref


@pytest.mark.slow
@pytest.mark.parametrize("cin,cout,kvol,rounds", SHAPES, ids=lambda v: str(v))
def test_matches_reference(cin, cout, kvol, rounds):
    nonzero = 0
    for act, bias, residual in [(0, False, False), (1, True, False), (2, True, True), (0, False, True)]:
        x, w, nbr, scale, b, res = int8_operands(cin, cout, kvol, rounds, bias=bias, residual=residual, seed=cin + act)
        y, ref = _both(x, w, nbr, scale, b, res, act=act)
        assert y.dtype == torch.int8 and y.shape == (nbr.shape[0], cout)
        assert torch.equal(y, ref), (act, bias, residual, int((y.int() - ref.int()).abs().max()))
        nonzero += int((y != 0).sum())
    assert nonzero > 0  # the scales give outputs across the int8 range, not trivially zero


def test_many_columns():
    """Tables much wider than the kernel volume (many rounds of duplicate rows): the columns go in chunks."""
    for cin, kvol, rounds in [(1, 27, 150), (3, 1, 700)]:
        x, w, nbr, scale, b, res = int8_operands(cin, 5, kvol, rounds, num_in=50, num_out=40, seed=rounds)
        y, ref = _both(x, w, nbr, scale, b, res, act=1)
        assert torch.equal(y, ref), (cin, kvol, rounds)


def test_epilogue_rounding_ties_and_saturation():
    """Sums that land exactly on .5 round to even; large ones saturate; LeakyReLU rounds its product."""
    x = torch.tensor([[1], [2], [3], [5], [-3], [-5], [127], [-128]], dtype=torch.int8)
    w = torch.ones(1, 1, 4, dtype=torch.int8)
    nbr = torch.arange(8, dtype=torch.int32).reshape(8, 1)
    scale = torch.tensor([0.5, 1.5, 2.0, 0.1], dtype=torch.float32)
    for act, alpha in [(0, 0.0), (1, 0.0), (2, 0.3), (2, 1.0 / 3.0)]:
        y, ref = _both(x, w, nbr, scale, torch.tensor([0.0, 0.25, -0.5, 0.05]), None, act=act, alpha=alpha)
        assert torch.equal(y, ref), act
    y, _ = _both(x, w, nbr, torch.full((4,), 0.5), None, None)
    assert y[:4, 0].tolist() == [0, 1, 2, 2]  # 0.5, 1.0, 1.5, 2.5 -> ties to even


def test_extreme_values_at_the_int32_bound():
    """-128/127 everywhere with T * Cin just below 2^17: the exact sum nears 2^31 (the biased VNNI sum wraps)."""
    cin, kvol, rounds = 256, 27, 18  # 486 columns x 256 = 124416 products of up to 2^14
    nbr = torch.zeros(3, kvol * rounds, dtype=torch.int32)
    nbr[1, ::2] = -1
    for xv, wv in [(-128, -128), (-128, 127), (127, 127), (127, -128)]:
        x = torch.full((1, cin), xv, dtype=torch.int8)
        w = torch.full((kvol, cin, 17), wv, dtype=torch.int8)
        scale = torch.full((17,), 2.0 ** -24)
        y, ref = _both(x, w, nbr, scale, None, None)
        assert torch.equal(y, ref), (xv, wv)
    with pytest.raises(ValueError, match="products"):
        OPS.quantized_conv(x, w, torch.zeros(1, 27 * 19, dtype=torch.int32), scale, None, None, 0.0, 0, 0.0)


def test_special_float_values():
    x, w, nbr, scale, bias, res = special_operands()
    for act, alpha in [(0, 0.0), (1, 0.0), (2, float("nan")), (2, -2.0)]:
        y, ref = _both(x, w, nbr, scale, bias, res, act=act, alpha=alpha)
        assert torch.equal(y, ref), act


def test_empty_sizes():
    for num_in, num_out, cin, cout in [(0, 7, 16, 16), (10, 0, 16, 16), (0, 0, 3, 5), (10, 7, 0, 16),
                                       (10, 7, 16, 0)]:
        x, w, nbr, scale, b, res = int8_operands(cin, cout, 27, 1, num_in=num_in, num_out=num_out)
        y, ref = _both(x, w, nbr, scale, b, res, act=1)
        assert y.shape == (num_out, cout) and torch.equal(y, ref), (num_in, num_out, cin, cout)


def test_real_map_with_map_info():
    g = torch.Generator().manual_seed(3)
    coords = torch.unique(torch.randint(0, 12, (700, 3), dtype=torch.int32, generator=g), dim=0)
    idx = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1)
    shape = [12, 12, 12]
    _, pin, pout, poff, info, table = OPS.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3,
                                                           True, False)
    assert table.shape == (len(idx), 27)
    x, w, _, scale, b, res = int8_operands(32, 48, 27, 1, num_in=len(idx), num_out=len(idx))
    y, ref = _both(x, w, table, scale, b, res, act=2, map_info=info)
    assert torch.equal(y, ref)
    assert torch.equal(y, OPS.quantized_conv(x, w, table, scale, b, res, 0.37, 2, 0.1))  # without map_info
    bad = table.clone()
    bad[5, 3] = len(idx) + 4  # a table that map_info does not describe: the kernel still refuses it
    with pytest.raises(ValueError, match="nbr"):
        OPS.quantized_conv(x, w, bad, scale, b, res, 0.37, 2, 0.1, info)


def test_thread_counts_give_the_same_bits():
    x, w, nbr, scale, b, res = int8_operands(64, 64, 27, 1, num_in=3000, num_out=2500, fill=0.3)
    saved = torch.get_num_threads()
    try:
        outs = []
        for n in (1, 2):
            torch.set_num_threads(n)
            outs.append(OPS.quantized_conv(x, w, nbr, scale, b, res, 0.37, 1, 0.0))
    finally:
        torch.set_num_threads(saved)
    assert torch.equal(outs[0], outs[1])
    assert torch.equal(outs[0], int8_conv_reference(x, w, nbr, scale, b, res, 0.37, 1, 0.0))


def test_path_name_and_build_info():
    path = OPS.quantized_conv_path(torch.zeros(1, 1, dtype=torch.int8))
    assert path in ("avx512_vnni", "avx2", "generic")
    assert _backend.build_info()["int8_cpu_path"] == path


# ---- every instruction-set body, in subprocesses under SPCONV_CPU_ISA ----
RUN = r"""
import sys
import torch
import spconv  # noqa: F401
sys.path.insert(0, "test")
from support.int8_cases import SHAPES, int8_operands, special_operands
ops = torch.ops.spconv
out = {"path": ops.quantized_conv_path(torch.zeros(1, 1, dtype=torch.int8))}
for i, (cin, cout, kvol, rounds) in enumerate(SHAPES):
    x, w, nbr, scale, b, res = int8_operands(cin, cout, kvol, rounds, seed=100 + i)
    out[(cin, cout, kvol, rounds)] = ops.quantized_conv(x, w, nbr, scale, b, res, 0.37, i % 3, 0.1)
out["special"] = ops.quantized_conv(*special_operands(), 0.37, 2, -2.0)
x, w, nbr, scale, b, res = int8_operands(64, 96, 27, 1, num_in=3000, num_out=2500, fill=0.3)
for n in (1, 2):
    torch.set_num_threads(n)
    out["threads%d" % n] = ops.quantized_conv(x, w, nbr, scale, b, res, 0.37, 2, 0.1)
torch.save(out, sys.argv[1])
"""


def _cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return None


@pytest.mark.slow
@pytest.mark.parametrize("isa", ["avx512", "avx2", "generic"])
def test_every_isa_body_matches_the_reference(isa, tmp_path):
    env = dict(os.environ, SPCONV_CPU_ISA=isa)
    path = str(tmp_path / "out.pt")
    subprocess.run([sys.executable, "-c", RUN, path], cwd=ROOT, env=env, check=True, timeout=600)
    out = torch.load(path)
    flags = _cpu_flags()
    if isa == "generic":
        assert out["path"] == "generic"
    elif flags is not None:
        vnni = {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"} <= flags
        has_avx2 = {"avx2", "fma"} <= flags
        expect = "avx512_vnni" if isa == "avx512" and vnni else "avx2" if has_avx2 else "generic"
        assert out["path"] == expect, (isa, out["path"])
    for i, shape in enumerate(SHAPES):
        x, w, nbr, scale, b, res = int8_operands(*shape, seed=100 + i)
        ref = int8_conv_reference(x, w, nbr, scale, b, res, 0.37, i % 3, 0.1)
        assert torch.equal(out[shape], ref), (isa, shape)
    assert torch.equal(out["special"], int8_conv_reference(*special_operands(), 0.37, 2, -2.0))
    x, w, nbr, scale, b, res = int8_operands(64, 96, 27, 1, num_in=3000, num_out=2500, fill=0.3)
    assert torch.equal(out["threads1"], out["threads2"])
    assert torch.equal(out["threads1"], int8_conv_reference(x, w, nbr, scale, b, res, 0.37, 2, 0.1))


# ---- bad arguments: exceptions naming the argument, never a crash ----
def _call(**kw):
    x, w, nbr, scale, b, res = int8_operands(8, 16, 27, 1, num_in=20, num_out=10)
    args = dict(features=x, filters=w, nbr=nbr, scale=scale, bias=b, residual=res, residual_scale=0.5,
                activation=0, alpha=0.0, map_info=None)
    args.update(kw)
    return OPS.quantized_conv(*args.values())


@pytest.mark.parametrize("kw,exc,match", [
    (dict(features=torch.zeros(20, 8)), TypeError, "features"),
    (dict(features=torch.zeros(20, 8, 1, dtype=torch.int8)), ValueError, "features"),
    (dict(filters=torch.zeros(27, 8, 16)), TypeError, "filters"),
    (dict(filters=torch.zeros(27, 9, 16, dtype=torch.int8)), ValueError, "filters"),
    (dict(nbr=torch.zeros(10, 27, dtype=torch.int64)), TypeError, "nbr"),
    (dict(nbr=torch.zeros(10, 26, dtype=torch.int32)), ValueError, "multiple"),
    (dict(nbr=torch.full((10, 27), 20, dtype=torch.int32)), ValueError, "nbr"),
    (dict(nbr=torch.full((10, 27), -2, dtype=torch.int32)), ValueError, "nbr"),
    (dict(scale=torch.ones(15)), ValueError, "scale"),
    (dict(scale=torch.ones(16, dtype=torch.float64)), TypeError, "scale"),
    (dict(bias=torch.ones(16, dtype=torch.int32)), TypeError, "bias"),
    (dict(bias=torch.ones(3)), ValueError, "bias"),
    (dict(residual=torch.zeros(10, 15, dtype=torch.int8)), ValueError, "residual"),
    (dict(residual=torch.zeros(9, 16, dtype=torch.int8)), ValueError, "residual"),
    (dict(residual=torch.zeros(10, 16)), TypeError, "residual"),
    (dict(activation=3), ValueError, "activation"),
    (dict(map_info=torch.zeros(3, dtype=torch.int64)), ValueError, "map_info"),
], ids=lambda v: v if isinstance(v, str) else None)
def test_bad_arguments(kw, exc, match):
    with pytest.raises(exc, match=match):
        _call(**kw)


def test_noncontiguous_inputs():
    x, w, nbr, scale, b, res = int8_operands(16, 32, 8, 1)
    xt = x.t().contiguous().t()
    wt = w.transpose(1, 2).contiguous().transpose(1, 2)
    nt = nbr.t().contiguous().t()
    y = OPS.quantized_conv(xt, wt, nt, scale, b, res.t().contiguous().t(), 0.37, 1, 0.0)
    assert torch.equal(y, int8_conv_reference(x, w, nbr, scale, b, res, 0.37, 1, 0.0))


# ---- int8 max pooling ----
def _pool_map(ksize, stride, padding, seed=0):
    g = torch.Generator().manual_seed(seed)
    shape = [10, 9, 8]
    coords = torch.unique(torch.stack([torch.randint(0, s, (300,), generator=g, dtype=torch.int32) for s in shape], 1),
                          dim=0)
    idx = torch.cat([torch.randint(0, 2, (len(coords), 1), generator=g, dtype=torch.int32), coords], 1)
    out_shape = get_conv_output_size(shape, [ksize] * 3, [stride] * 3, [padding] * 3, [1] * 3)
    out_idx, pin, pout, poff, info, _ = OPS.get_indice_pairs(idx, 2, shape, out_shape, [ksize] * 3, [stride] * 3,
                                                             [padding] * 3, [1] * 3, False, False)
    return len(idx), len(out_idx), pin, pout, poff, info


@pytest.mark.parametrize("ksize,stride,padding", [(2, 2, 0), (3, 2, 1), (3, 1, 1)])
def test_int8_maxpool_matches_the_float_op_and_a_direct_reference(ksize, stride, padding):
    num_in, num_out, pin, pout, poff, info = _pool_map(ksize, stride, padding, seed=ksize + stride)
    g = torch.Generator().manual_seed(1)
    for c in (1, 16, 35):
        x = torch.randint(-128, 128, (num_in, c), dtype=torch.int8, generator=g)
        x[: num_in // 3] = -128  # windows of negatives only: the output stays 0
        y = OPS.indice_maxpool(x, pin, pout, poff, num_out, info)
        assert y.dtype == torch.int8 and y.shape == (num_out, c)
        via_float = OPS.indice_maxpool(x.float(), pin, pout, poff, num_out, info).to(torch.int8)
        assert torch.equal(y, via_float)
        ref = torch.zeros(num_out, c, dtype=torch.int8)  # max(0, max over the window)
        ref = ref.scatter_reduce(0, pout.long()[:, None].expand(-1, c), x[pin.long()], "amax", include_self=True)
        assert torch.equal(y, ref)
        assert torch.equal(y, OPS.indice_maxpool(x, pin, pout, poff, num_out, None))  # without map_info


def test_int8_maxpool_opcheck():
    num_in, num_out, pin, pout, poff, info = _pool_map(3, 2, 1)
    x = torch.randint(-128, 128, (num_in, 8), dtype=torch.int8, generator=torch.Generator().manual_seed(2))
    torch.library.opcheck(OPS.indice_maxpool.default, (x, pin, pout, poff, num_out, info))


def test_int8_pooling_refusals():
    num_in, num_out, pin, pout, poff, info = _pool_map(2, 2, 0)
    x = torch.zeros(num_in, 4, dtype=torch.int8)
    y = OPS.indice_maxpool(x, pin, pout, poff, num_out, info)
    with pytest.raises(TypeError, match="int8"):
        OPS.indice_maxpool_backward(x, y, y, pin, pout, poff, info)
    with pytest.raises(TypeError, match="features"):
        OPS.indice_avgpool(x, pin, pout, poff, num_out, info)
    with pytest.raises(TypeError, match="features"):
        OPS.indice_maxpool(x.to(torch.int16), pin, pout, poff, num_out, info)


@pytest.mark.parametrize("with_extras", [False, True], ids=["plain", "bias_residual"])
def test_opcheck(with_extras):
    """Schema, fake kernel (spconv/pytorch/_int8.py) and dispatch agree (torch.library.opcheck)."""
    g = torch.Generator().manual_seed(3)
    x = torch.randint(-128, 128, (30, 12), dtype=torch.int8, generator=g)
    w = torch.randint(-128, 128, (8, 12, 20), dtype=torch.int8, generator=g)
    nbr = random_table(30, 25, 8, generator=g)
    bias = torch.randn(20, generator=g) if with_extras else None
    res = torch.randint(-128, 128, (25, 20), dtype=torch.int8, generator=g) if with_extras else None
    torch.library.opcheck(torch.ops.spconv.quantized_conv.default,
                          (x, w, nbr, torch.rand(20, generator=g) * 0.01, bias, res, 0.3, 1, 0.0, None))
