"""Every HIP CPU build variant (tools/hip_cpu_build.py VARIANTS: plain SIMT, emulated WMMA, MFMA and sm_80)
runs the fused forward, dinput and dfilter of FP16/BF16 within tolerance of an FP64 reference, and the
emulated bodies agree bit for bit with the SIMT body, in both thread orders of a block (conftest.thread_order; the
SIMT body run in descending order too). A variant is skipped until the tree enables it (the
emulation headers under csrc/hip/emu). The emulators have their own tests (test/hip_cpu/), so a failure here
is the kernel's."""
import glob
import os
import re
import sys

import pytest
import torch

import spconv.pytorch as spconv
from spconv import _backend, constants
from conftest import _TOOLS, SESSION_ORDER, hip_cpu_library, thread_order
from support.conv_cases import TOL, as_maps, fused_inputs, map_geometry, native_f64, rel_err

sys.path.insert(0, _TOOLS)
import hip_cpu_build  # noqa: E402

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv
EMULATED = ["wmma", "mfma", "sm80"]
DTYPES = pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
# (cin, cout, geometry): channels a multiple of 8 (vector loads) and not, one past a tile, several K steps and
# column tiles; kernel volumes 27 and 8; a sparse map whose offsets leave whole row tiles empty (mask walk);
# several 64-channel K steps per offset without vector loads (the sm80 body's deep K step, scalar copies).
CASES = {
    "vec": (40, 72, dict(shape=[6, 7, 5], batch=2, n=120, ksize=3)),
    "scalar": (13, 70, dict(shape=[6, 7, 5], batch=2, n=120, ksize=3)),
    "wide": (72, 136, dict(shape=[8, 8, 8], batch=1, n=100, ksize=2, stride=2, subm=False)),
    "sparse": (33, 65, dict(shape=[12, 12, 12], batch=1, n=150, ksize=3)),
    "deep": (140, 12, dict(shape=[5, 5, 5], batch=1, n=50, ksize=3)),
}


_RESULTS = {}


def results(variant, case, dtype):
    """run_fused of a variant in the session's thread order, computed once: the low-precision bound and the
    comparisons with the SIMT body read the same results."""
    key = (variant, case, dtype)
    if key not in _RESULTS:
        _RESULTS[key] = run_fused(hip_cpu_library(variant), case, dtype)
    return _RESULTS[key]


def run_fused(ops, case, dtype, splits=2, tf32=False, inputs=lambda t: t):
    """(forward, dinput, dfilter) of ops on the case's inputs (each through ``inputs``), plus the inputs' maps for
    a reference; tf32: FP32 may take TF32 operands."""
    cin, cout, geo = CASES[case]
    idx, args = map_geometry(**geo)
    m = as_maps(cpu.get_indice_pairs(idx, *args), idx.shape[0])
    x, w, dy = (inputs(t) for t in fused_inputs(m, cin, cout, dtype))
    s = min(splits, m.pair_offsets.numel() - 1)
    y = ops.fused_conv(x, w, *ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, s), tf32=tf32)
    dx = ops.fused_conv(dy, w.transpose(1, 2).contiguous(),
                        *ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, s), tf32=tf32)
    dw = ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets, tf32=tf32)
    return (y, dx, dw), (x, w, dy, m)


def tf32_rna(t):
    """cvt.rna.tf32.f32 on finite FP32 values: 10 mantissa bits, to nearest, ties away from zero."""
    u = t.contiguous().view(torch.int32)
    return ((u + 0x1000) & ~0x1FFF).view(torch.float32)


@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("variant", sorted(hip_cpu_build.VARIANTS))
def test_tf32_same_bits_as_simt(variant, case):
    """FP32 with TF32 allowed: the emulated WMMA variant (NVIDIA sm_80+ code) runs the TF32 bodies, whose
    forward, dinput and dfilter give the SIMT body's bits on inputs rounded to TF32 beforehand, within TF32's
    rounding of an FP64 reference; the other variants have no TF32 body and give the SIMT body's bits on the
    inputs as they are. Without the flag every variant runs SIMT."""
    ops = hip_cpu_library(variant)
    has = variant == "wmma"
    assert ops.fused_conv_path(torch.zeros(2, 8), True) == ("tf32" if has else "simt")
    assert ops.fused_conv_path(torch.zeros(2, 8)) == "simt"
    got, (x, w, dy, m) = run_fused(ops, case, torch.float32, tf32=True)
    ref, _ = run_fused(hip_cpu_library("simt"), case, torch.float32, inputs=tf32_rna if has else lambda t: t)
    for what, g, r, r64 in zip(("forward", "dinput", "dfilter"), got, ref, native_f64(x, w, dy, m)):
        assert torch.equal(g.view(torch.int32), r.view(torch.int32)), what
        assert rel_err(g, r64) < 2e-3, "%s: relative error %g" % (what, rel_err(g, r64))
    if has:  # the operands were rounded: FP32 operands give other bits
        fp32, _ = results("simt", case, torch.float32)
        assert not torch.equal(got[0], fp32[0])


@pytest.mark.parametrize("variant", sorted(hip_cpu_build.VARIANTS))
def test_variant_reports_its_body(variant):
    ops = hip_cpu_library(variant)
    x = torch.zeros(4, 8)
    assert ops.fused_conv_path(x) == "simt"  # FP32 always runs the SIMT body
    for dtype in (torch.float16, torch.bfloat16):
        assert ops.fused_conv_path(x.to(dtype)) == variant


@pytest.mark.parametrize("setting", [None, "0", "1"], ids=["unset", "off", "on"])
@pytest.mark.parametrize("variant", sorted(hip_cpu_build.VARIANTS))
def test_fused_sm80_switch(variant, setting, monkeypatch):
    """SPCONV_FUSED_SM80, read at every launch, picks the pipelined sm_80 bodies where they are compiled (the
    sm80 variant here, as NVIDIA builds for sm_80+): unset they are the sm80 variant's default, =0 gives the other
    instantiation (SIMT in this variant) and =1 asks for them; where they are absent it changes nothing. The
    forward, dinput and dfilter of the other instantiation give the SIMT body's bits."""
    if setting is None:
        monkeypatch.delenv("SPCONV_FUSED_SM80", raising=False)
    else:
        monkeypatch.setenv("SPCONV_FUSED_SM80", setting)
    ops = hip_cpu_library(variant)
    body = "simt" if variant == "sm80" and setting == "0" else variant
    for dtype in (torch.float16, torch.bfloat16):
        assert ops.fused_conv_path(torch.zeros(4, 8, dtype=dtype)) == body
    if variant == "sm80" and setting == "0":
        simt, _ = results("simt", "vec", torch.float16)
        got, _ = run_fused(ops, "vec", torch.float16)
        for what, g, r in zip(("forward", "dinput", "dfilter"), got, simt):
            assert torch.equal(g.view(torch.int16), r.view(torch.int16)), what


@pytest.mark.parametrize("variant", EMULATED)
def test_three_splits_same_bits_as_simt(variant):
    """Three mask splits (the MFMA body's policy above SPLIT_WORK, _fused.WIDE_SPLITS_MFMA): the third pass adds
    to the first two as the second does to the first, with the SIMT body's bits."""
    simt, _ = run_fused(hip_cpu_library("simt"), "wide", torch.float16, splits=3)
    got, _ = run_fused(hip_cpu_library(variant), "wide", torch.float16, splits=3)
    for what, g, r in zip(("forward", "dinput", "dfilter"), got, simt):
        assert torch.equal(g.view(torch.int16), r.view(torch.int16)), what


def test_tf32_switches(monkeypatch):
    """A model's FP32 layer takes the TF32 body, forward and backward, where spconv's switch
    (constants.SPCONV_ALLOW_TF32, set after import as spconv 2.x users do) or torch's
    (torch.backends.cuda.matmul.allow_tf32) allows it: the SIMT body's bits on inputs and weights rounded to TF32;
    with neither, FP32."""
    g = torch.Generator().manual_seed(4)
    idx, args = map_geometry(shape=[6, 7, 5], batch=2, n=120, ksize=3)
    feats = torch.randn(idx.shape[0], 16, generator=g)
    weight = torch.randn(16, 3, 3, 3, 16, generator=g)

    def run(library, rounding=lambda t: t):
        conv = spconv.SubMConv3d(16, 16, 3, bias=False)
        with torch.no_grad():
            conv.weight.copy_(rounding(weight))
        x = rounding(feats).clone().requires_grad_(True)
        with _backend.gpu_code_on_cpu(hip_cpu_library(library).name):
            y = conv(spconv.SparseConvTensor(x, idx, [6, 7, 5], 2)).features
            y.sum().backward()
        return [t.detach().clone() for t in (y, x.grad, conv.weight.grad)]

    fp32 = run("wmma")
    assert all(torch.equal(a, b) for a, b in zip(fp32, run("simt")))
    want = run("simt", tf32_rna)
    monkeypatch.setattr(constants, "SPCONV_ALLOW_TF32", True)
    by_spconv = run("wmma")
    monkeypatch.setattr(constants, "SPCONV_ALLOW_TF32", False)
    old = torch.backends.cuda.matmul.allow_tf32  # a property object: set and restored by hand, not monkeypatched
    try:
        torch.backends.cuda.matmul.allow_tf32 = True
        by_torch = run("wmma")
    finally:
        torch.backends.cuda.matmul.allow_tf32 = old
    for what, a, b, w, f in zip(("forward", "dinput", "dfilter"), by_spconv, by_torch, want, fp32):
        assert torch.equal(a, w) and torch.equal(b, w), what
        assert not torch.equal(a, f), what  # the operands were rounded


@pytest.mark.slow
@DTYPES
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("variant", sorted(hip_cpu_build.VARIANTS))
def test_variant_fused_low_precision(variant, case, dtype):
    got, (x, w, dy, m) = results(variant, case, dtype)
    for what, g, ref in zip(("forward", "dinput", "dfilter"), got, native_f64(x, w, dy, m)):
        assert g.dtype == dtype and g.shape == ref.shape, what
        assert torch.isfinite(g).all(), "%s %s: outputs left unwritten or overflowed" % (variant, what)
        assert rel_err(g, ref) < TOL[dtype], "%s %s: relative error %g" % (variant, what, rel_err(g, ref))


@pytest.mark.slow
@DTYPES
@pytest.mark.parametrize("case", sorted(CASES))
@pytest.mark.parametrize("variant, order", [(v, o) for v in EMULATED for o in ("ascending", "descending")]
                         + [("simt", "descending")])
def test_same_bits_as_simt(variant, order, case, dtype):
    """Sharper than the bound: the emulators add exact products one at a time in k order, and the SIMT body's
    fmaf chain runs over the same k sequence (tile steps of 32 = two MMA steps of 16, offsets in order), so on
    this build the bodies agree bit for bit. (On a GPU the matrix cores' internal order differs.) The order in
    which a block's threads run changes no bit either: no atomics in forward and dinput, a fixed-order split-K in
    dfilter."""
    simt, _ = results("simt", case, dtype)
    if order == SESSION_ORDER:
        got, _ = results(variant, case, dtype)
    else:
        with thread_order(order, variant):
            got, _ = run_fused(hip_cpu_library(variant), case, dtype)
    for what, g, s in zip(("forward", "dinput", "dfilter"), got, simt):
        diff = (g.view(torch.int16) != s.view(torch.int16)).sum().item()
        assert diff == 0, "%s %s: %d of %d outputs differ from the SIMT body" % (variant, what, diff, g.numel())


def test_variant_kernels_listed():
    """Objects outside a variant's kernel list are shared with the plain build: every kernel whose code the
    emulation switches must be listed."""
    src = hip_cpu_build.REPO
    # SPCONV_INT8_MMA / SPCONV_INT8_MFMA (int8_dot.h) are the matrix-core switches of the int8 kernel.
    switch = {"wmma": r"SPCONV_DEVICE_WMMA|SPCONV_INT8_MMA|SPCONV_EMULATE_",
              "mfma": r"SPCONV_DEVICE_MFMA|SPCONV_INT8_MFMA|SPCONV_EMULATE_",
              "sm80": r"SPCONV_DEVICE_SM80|SPCONV_FORWARD_SM80|SPCONV_EMULATE_|tc_sm80\.h"}
    for name in EMULATED:
        uses = {os.path.relpath(p, src) for p in glob.glob(os.path.join(src, "csrc", "hip", "*.cu"))
                if re.search(switch[name], open(p).read())}
        assert uses, "no kernel uses the %s matrix cores: the check would be empty" % name
        assert uses <= set(hip_cpu_build.VARIANTS[name].kernels), name


def test_variants_share_the_glue_objects():
    """The schema and the glue read the op namespace at load time (csrc/ops/op_namespace.cpp): between variants
    only that file and the variant's listed kernels compile with other defines, so a second variant's build
    compiles those alone."""
    src = hip_cpu_build.REPO
    plain = hip_cpu_build.VARIANTS["simt"]
    for name in EMULATED:
        v = hip_cpu_build.VARIANTS[name]
        differs = {os.path.relpath(p, src).replace(os.sep, "/") for p, kind in hip_cpu_build._sources(src).items()
                   if hip_cpu_build._file_defines(p, kind, src, v) != hip_cpu_build._file_defines(p, kind, src, plain)}
        assert differs == {"csrc/ops/op_namespace.cpp"} | set(v.kernels), name
