"""The fused route's WMMA and MFMA bodies (csrc/hip/fused_conv.cu) on the CPU, through the emulators, against an
FP64 reference of the same rounded inputs. The emulators have their own tests (test_wmma_emu.py,
test_mfma_emu.py), so a failure here is the kernel's. FP32 runs the SIMT body: a check of this harness."""
import numpy as np
import pytest

import _hip_cpu
from _tiles import from_bits, to_bits

pytestmark = pytest.mark.hip_cpu

BOUND = {"f16": 2e-3, "bf16": 1e-2, "f32": 1e-5}  # relative to the output norm
# (cin, cout, kvol, splits, density): channels a multiple of 8 (vector loads) and not, one past a tile, several
# K steps and column tiles; the sparse map leaves offsets unused by whole row tiles (skipped through the masks).
SHAPES = [(40, 72, 27, 2, 0.3), (37, 67, 8, 1, 0.3), (72, 136, 8, 3, 0.3), (33, 65, 27, 2, 0.02)]
SHAPE_ID = "ci{}_co{}_k{}_s{}_d{}".format
N_IN, N_OUT = 150, 140  # three row tiles of 64, the last one partial


@pytest.fixture(scope="module", params=["wmma", "mfma"])
def variant(request):
    v = request.param
    exe = _hip_cpu.build(f"fused_{v}", ["csrc/hip/fused_conv.cu", "test/hip_cpu/fused_driver.cpp"],
                         [f"SPCONV_EMULATE_{v.upper()}=1"], rewrite=["csrc/hip/fused_conv.cu"])
    return v, exe


def kernel_map(rng, kvol, density):
    """Pairs grouped by offset, shuffled inside each group; an output row meets each offset at most once."""
    pin, pout, offsets = [], [], [0]
    for _ in range(kvol):
        rows = rng.permutation(np.nonzero(rng.random(N_OUT) < density)[0])
        pout.append(rows)
        pin.append(rng.integers(0, N_IN, rows.size))
        offsets.append(offsets[-1] + rows.size)
    return np.concatenate(pin).astype(np.int32), np.concatenate(pout).astype(np.int32), np.array(offsets, np.int64)


def rounded(rng, shape, dtype, scale=1.0):
    """Random values in dtype: (bits or fp32 array to hand over, the exact values as fp64)."""
    v = (rng.standard_normal(shape) * scale).astype(np.float32)
    if dtype == "f32":
        return v, v.astype(np.float64)
    bits = to_bits(v, dtype)
    return bits, from_bits(bits, dtype).astype(np.float64)


def decode(path, dtype, shape):
    if dtype == "f32":
        return np.fromfile(path, dtype=np.float32).reshape(shape).astype(np.float64)
    return from_bits(np.fromfile(path, dtype=np.uint16), dtype).reshape(shape).astype(np.float64)


def write_case(d, arrays, meta):
    (d / "meta.txt").write_text(" ".join(str(v) for v in meta))
    for name, arr in arrays.items():
        arr.tofile(d / f"{name}.bin")


def check(out, ref, dtype):
    assert np.isfinite(out).all(), "outputs left unwritten (NaN) or overflowed"
    rel = np.linalg.norm(out - ref) / np.linalg.norm(ref)
    assert rel <= BOUND[dtype], f"relative error {rel:.3g} > {BOUND[dtype]}"


def expected_path(v, dtype):
    return "simt" if dtype == "f32" else v


def forward_case(d, dtype, shape):
    """Writes a forward case to folder d; returns the FP64 reference y."""
    cin, cout, kvol, splits, density = shape
    rng = np.random.default_rng(cin * 1000 + cout + kvol)
    pin, pout, offsets = kernel_map(rng, kvol, density)
    x, x64 = rounded(rng, (N_IN, cin), dtype)
    w, w64 = rounded(rng, (kvol, cin, cout), dtype, scale=(density * kvol * cin) ** -0.5)
    order = np.stack([rng.permutation(N_OUT) for _ in range(splits)]).astype(np.int32)
    write_case(d, dict(x=x, w=w, pair_in=pin, pair_out=pout, pair_offsets=offsets, order=order),
               (N_IN, N_OUT, kvol, cin, cout, pin.size, splits))
    ref = np.zeros((N_OUT, cout))
    for k in range(kvol):
        s = slice(offsets[k], offsets[k + 1])
        ref[pout[s]] += x64[pin[s]] @ w64[k]  # an output row appears once per offset
    return ref


def dfilter_case(d, dtype, shape):
    """Writes a dfilter case to folder d; returns the FP64 reference dW."""
    cin, cout, kvol, splits, density = shape
    rng = np.random.default_rng(cin * 1000 + cout + kvol + 1)
    pin, pout, offsets = kernel_map(rng, kvol, density)
    x, x64 = rounded(rng, (N_IN, cin), dtype)
    dy, dy64 = rounded(rng, (N_OUT, cout), dtype)
    write_case(d, dict(x=x, dy=dy, pair_in=pin, pair_out=pout, pair_offsets=offsets),
               (N_IN, N_OUT, kvol, cin, cout, pin.size, splits))
    return np.stack([x64[pin[offsets[k]:offsets[k + 1]]].T @ dy64[pout[offsets[k]:offsets[k + 1]]]
                     for k in range(kvol)])


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: SHAPE_ID(*s))
def test_forward(variant, tmp_path, dtype, shape):
    v, exe = variant
    ref = forward_case(tmp_path, dtype, shape)
    r = _hip_cpu.run(exe, "forward", dtype, tmp_path)
    assert f"path {expected_path(v, dtype)}" in r.stdout
    check(decode(tmp_path / "y.bin", dtype, ref.shape), ref, dtype)


@pytest.mark.parametrize("dtype", ["f16", "bf16", "f32"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: SHAPE_ID(*s))
def test_dfilter(variant, tmp_path, dtype, shape):
    _, exe = variant
    ref = dfilter_case(tmp_path, dtype, shape)
    _hip_cpu.run(exe, "dfilter", dtype, tmp_path)
    check(decode(tmp_path / "dw.bin", dtype, ref.shape), ref, dtype)


@pytest.fixture(scope="module")
def simt_exe():
    return _hip_cpu.build("fused_simt", ["csrc/hip/fused_conv.cu", "test/hip_cpu/fused_driver.cpp"],
                          rewrite=["csrc/hip/fused_conv.cu"])


@pytest.mark.parametrize("op", ["forward", "dfilter"])
@pytest.mark.parametrize("dtype", ["f16", "bf16"])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: SHAPE_ID(*s))
def test_same_bits_as_simt(variant, simt_exe, tmp_path, op, dtype, shape):
    """Sharper than the bound: the emulators add exact products one at a time in k order, and the SIMT body's
    fmaf chain runs over the same k sequence (tile steps of 32 = two MMA steps of 16, offsets in order), so on
    this build the bodies agree bit for bit. (On a GPU the matrix cores' internal order differs.)"""
    _, exe = variant
    (forward_case if op == "forward" else dfilter_case)(tmp_path, dtype, shape)
    out = tmp_path / ("y.bin" if op == "forward" else "dw.bin")
    _hip_cpu.run(simt_exe, op, dtype, tmp_path)
    simt = np.fromfile(out, dtype=np.uint16)
    r = _hip_cpu.run(exe, op, dtype, tmp_path)
    assert "path simt" not in r.stdout
    got = np.fromfile(out, dtype=np.uint16)
    assert (got == simt).all(), f"{np.count_nonzero(got != simt)} of {got.size} outputs differ from the SIMT body"
