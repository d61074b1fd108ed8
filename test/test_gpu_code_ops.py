"""The GPU code (csrc/ops/gpu glue + csrc/hip kernels) executed on the CPU through the HIP CPU runtime,
operator by operator, against the CPU route (torch.ops.spconv) on the same inputs: kernel maps, fused
forward / dinput / dfilter, the native GPU route, pooling, voxelization and hash tables. Small sizes: every
GPU thread is a fiber here."""
import pytest
import torch

from spconv import _backend

from conftest import THREAD_ORDERS, thread_order
from support.sites import random_coords
from test_fused_cpu import Maps, map_geometry, sorted_pairs

pytestmark = pytest.mark.hip_cpu

cpu = torch.ops.spconv

# name -> geometry; chosen to reach kernel volumes 1, 8, 27, 125, 2-D and 4-D, strides, dilation, transpose
MAPS = {
    "subm_k1": dict(shape=[6, 6, 6], batch=1, n=50, ksize=1),
    "subm3": dict(shape=[6, 7, 5], batch=2, n=120, ksize=3),
    "subm_dense": dict(shape=[4, 4, 4], batch=1, n=64, ksize=3),
    "subm5_kvol125": dict(shape=[7, 7, 7], batch=1, n=90, ksize=5),
    "subm2d_k12": dict(shape=[9, 9], batch=2, n=70, ksize=(1, 2)),
    "dilated": dict(shape=[10, 10, 10], batch=1, n=100, ksize=3, dilation=2),
    "conv_s2": dict(shape=[9, 8, 7], batch=2, n=150, ksize=3, stride=2, padding=1, subm=False),
    "conv_k2s2": dict(shape=[8, 8, 8], batch=1, n=100, ksize=2, stride=2, subm=False),
    "conv4d": dict(shape=[4, 4, 4, 3], batch=1, n=60, ksize=2, stride=1, subm=False),
    "deconv": dict(shape=[5, 4, 6], batch=1, n=40, ksize=3, stride=2, padding=1, subm=False, transpose=True),
}


def both_maps(name):
    """(indices, CPU result, GPU-code result) of get_indice_pairs for one geometry."""
    idx, args = map_geometry(**MAPS[name])
    return idx, cpu.get_indice_pairs(idx, *args), hip_ops().get_indice_pairs(idx, *args)


_HIP = {}


def hip_ops():
    return _HIP["ops"]


@pytest.fixture(autouse=True, params=THREAD_ORDERS)
def _ops(hip_cpu, request):
    """Every op in both thread orders of a block (conftest.thread_order), so that a barrier missing between the
    threads of a block changes some result."""
    _HIP["ops"] = hip_cpu
    with thread_order(request.param):
        yield


def as_maps(res, num_in):
    out_idx, pin, pout, poff = res[:4]
    return Maps(pin, pout, poff, num_in, out_idx.shape[0])


def coord_keys(t):
    k = torch.zeros(t.shape[0], dtype=torch.int64)
    for c in range(t.shape[1]):
        k = k * 1024 + t[:, c].long()
    return k


# ---- kernel maps ----
@pytest.mark.parametrize("name", sorted(MAPS))
def test_kernel_map_pairs(name):
    idx, (c_out, c_pin, c_pout, c_poff, c_info, c_tab), (g_out, g_pin, g_pout, g_poff, g_info, g_tab) = both_maps(name)
    assert torch.equal(g_poff, c_poff)
    assert torch.equal(g_info, c_info)  # host record: offsets, row counts, repeat-free flag
    assert g_out.shape == c_out.shape and g_out.dtype == c_out.dtype
    if MAPS[name].get("subm", True):
        # SubM: the outputs are the input rows; same pairs in the same order
        assert torch.equal(g_out, idx) and torch.equal(g_pin, c_pin) and torch.equal(g_pout, c_pout)
        assert torch.equal(g_tab, c_tab)  # the neighbour table the fused route takes as its forward table
        return
    # regular / transposed: same output coordinate set, same (input, output coordinate) pairs per offset
    ck, gk = coord_keys(c_out), coord_keys(g_out)
    assert torch.equal(torch.sort(ck).values, torch.sort(gk).values)
    a = sorted_pairs(c_pin, ck[c_pout.long()], c_poff)
    b = sorted_pairs(g_pin, gk[g_pout.long()], g_poff)
    for k, (x, y) in enumerate(zip(a, b)):
        assert torch.equal(x, y), "offset %d" % k


@pytest.mark.parametrize("name", ["conv_s2", "deconv"])
def test_kernel_map_output_order(name):
    _, (c_out, c_pin, c_pout, *c_rest), (g_out, g_pin, g_pout, *g_rest) = both_maps(name)
    assert torch.equal(g_out, c_out) and torch.equal(g_pin, c_pin) and torch.equal(g_pout, c_pout)
    assert all(torch.equal(g, c) for g, c in zip(g_rest, c_rest))  # offsets, map_info, the table by input


def test_kernel_map_errors_and_empty():
    ops = hip_ops()
    dup = torch.tensor([[0, 1, 1, 1], [0, 2, 2, 2], [0, 1, 1, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="row 2 repeats"):
        ops.get_indice_pairs(dup, 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    with pytest.raises(ValueError):
        bad = torch.tensor([[0, 9, 1, 1]], dtype=torch.int32)
        ops.get_indice_pairs(bad, 1, [4, 4, 4], [4, 4, 4], [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)
    empty = torch.zeros(0, 4, dtype=torch.int32)
    for subm, out_shape, stride in ((True, [4, 4, 4], 1), (False, [2, 2, 2], 2)):
        res = ops.get_indice_pairs(empty, 1, [4, 4, 4], out_shape, [3] * 3, [stride] * 3, [1] * 3, [1] * 3, subm,
                                   False)
        ref = cpu.get_indice_pairs(empty, 1, [4, 4, 4], out_shape, [3] * 3, [stride] * 3, [1] * 3, [1] * 3, subm,
                                   False)
        for g, c in zip(res, ref):
            assert g.shape == c.shape and g.dtype == c.dtype and torch.equal(g, c)


# ---- fused route: tables, forward, dinput, dfilter ----
@pytest.mark.parametrize("name", ["subm3", "subm5_kvol125", "conv_s2", "deconv", "subm2d_k12"])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_fused_tables_match_cpu(name, splits):
    idx, res, _ = both_maps(name)
    m = as_maps(res, idx.shape[0])
    s = min(splits, m.pair_offsets.numel() - 1)
    for pin, pout, rows in ((m.pair_in, m.pair_out, m.num_out), (m.pair_out, m.pair_in, m.num_in)):
        g = hip_ops().build_fused_map(pin, pout, m.pair_offsets, rows, s)
        c = cpu.build_fused_map(pin, pout, m.pair_offsets, rows, s)
        for a, b in zip(g, c):
            assert torch.equal(a, b)


def rel_err(got, ref):
    ref = ref.double()
    return (torch.linalg.norm(got.double() - ref) / max(torch.linalg.norm(ref).item(), 1e-30)).item()


TOL = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}

# (map, cin, cout): Cin > 32 (several K steps), Cin > 64 (dfilter row tiles), Cout > 64 (several column
# tiles), channel counts multiples of 8 (vector loads) and not; kernel volumes 1, 8, 27, 125
FUSED_CASES = [
    ("subm3", 16, 32), ("subm3", 40, 72), ("subm3", 13, 70), ("subm_dense", 72, 24), ("subm_k1", 24, 16),
    ("subm5_kvol125", 8, 16), ("conv_k2s2", 33, 65), ("conv_s2", 64, 64), ("deconv", 24, 40),
    ("subm2d_k12", 5, 7),
]


def fused_inputs(m, cin, cout, dtype, seed=7):
    g = torch.Generator().manual_seed(seed)
    kvol = m.pair_offsets.numel() - 1
    x = torch.randn(m.num_in, cin, generator=g).to(dtype)
    w = (torch.randn(kvol, cin, cout, generator=g) / (cin * 3) ** 0.5).to(dtype)
    dy = torch.randn(m.num_out, cout, generator=g).to(dtype)
    return x, w, dy


def native_f64(x, w, dy, m):
    x, w, dy = x.double(), w.double(), dy.double()
    y = cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out)
    dx, dw = cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets)
    return y, dx, dw


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=["f32", "f16", "bf16"])
@pytest.mark.parametrize("case", FUSED_CASES, ids=["%s-%dx%d" % c for c in FUSED_CASES])
@pytest.mark.parametrize("splits", [1, 2, 3])
def test_fused_forward_dinput_dfilter(case, dtype, splits):
    name, cin, cout = case
    if dtype != torch.float32 and splits == 3:
        pytest.skip("low precision: splits 1 and 2 suffice")
    idx, res, _ = both_maps(name)
    m = as_maps(res, idx.shape[0])
    kvol = m.pair_offsets.numel() - 1
    s = min(splits, kvol)
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    ops = hip_ops()
    y = ops.fused_conv(x, w, *ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, s))
    rev = ops.build_fused_map(m.pair_out, m.pair_in, m.pair_offsets, m.num_in, s)
    dx = ops.fused_conv(dy, w.transpose(1, 2).contiguous(), *rev)
    dw = ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    assert y.dtype == dx.dtype == dw.dtype == dtype
    if dtype == torch.float32:  # against the CPU route in fp32, on the same inputs
        ref = (cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out),
               *cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets))
    else:  # against an fp64 reference of the same (rounded) inputs
        ref = native_f64(x, w, dy, m)
    for what, got, r in zip(("forward", "dinput", "dfilter"), (y, dx, dw), ref):
        assert got.shape == r.shape, what
        assert rel_err(got, r) < TOL[dtype], "%s: relative error %g" % (what, rel_err(got, r))


def test_fused_dfilter_split_k():
    """Enough pairs per offset (> 4096) for the glue to split K into several workspace chunks."""
    idx, args = map_geometry(shape=[24, 24, 24], batch=1, n=9000, ksize=1)
    res = cpu.get_indice_pairs(idx, *args)
    m = as_maps(res, idx.shape[0])
    x, _, dy = fused_inputs(m, 8, 8, torch.float32)
    got = hip_ops().fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    ref = cpu.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    assert rel_err(got, ref) < 1e-5


def test_fused_deterministic():
    idx, res, _ = both_maps("subm3")
    m = as_maps(res, idx.shape[0])
    x, w, dy = fused_inputs(m, 40, 72, torch.float16)
    ops = hip_ops()
    t = ops.build_fused_map(m.pair_in, m.pair_out, m.pair_offsets, m.num_out, 2)
    assert torch.equal(ops.fused_conv(x, w, *t), ops.fused_conv(x, w, *t))
    a = ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets)
    assert torch.equal(a, ops.fused_conv_dfilter(x, dy, m.pair_in, m.pair_out, m.pair_offsets))


def test_fused_empty_and_path():
    ops = hip_ops()
    z = torch.zeros(0, dtype=torch.int32)
    poff = torch.zeros(28, dtype=torch.int64)
    nbr, masks, order = ops.build_fused_map(z, z, poff, 6, 1)
    y = ops.fused_conv(torch.randn(0, 8), torch.randn(27, 8, 4), nbr, masks, order)
    assert y.shape == (6, 4) and torch.all(y == 0)
    n0, m0, o0 = ops.build_fused_map(z, z, poff, 0, 1)
    assert ops.fused_conv(torch.randn(0, 8), torch.randn(27, 8, 4), n0, m0, o0).shape == (0, 4)
    dw = ops.fused_conv_dfilter(torch.randn(0, 8), torch.randn(0, 4), z, z, poff)
    assert dw.shape == (27, 8, 4) and torch.all(dw == 0)
    e = ops.indice_conv(torch.randn(0, 8), torch.randn(27, 8, 4), z, z, poff, 5)
    assert e.shape == (5, 4) and torch.all(e == 0)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        assert ops.fused_conv_path(torch.zeros(1, dtype=dt)) == "simt"  # no matrix cores on the host


# ---- native GPU route: gather -> GEMM -> sum by position ----
@pytest.mark.slow
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("name,cin,cout", [("subm3", 40, 72), ("conv_s2", 13, 24), ("deconv", 8, 16),
                                           ("subm_k1", 5, 3)])
def test_native_route(name, cin, cout, dtype):
    idx, res, _ = both_maps(name)
    m = as_maps(res, idx.shape[0])
    x, w, dy = fused_inputs(m, cin, cout, dtype)
    ops = hip_ops()
    y = ops.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out)
    dx, dw = ops.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets)
    if dtype in (torch.float32, torch.float64):
        ref = (cpu.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out),
               *cpu.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets))
    else:
        ref = native_f64(x, w, dy, m)
    tol = 1e-12 if dtype == torch.float64 else TOL[dtype]
    for what, got, r in zip(("forward", "dinput", "dfilter"), (y, dx, dw), ref):
        assert got.dtype == dtype and got.shape == r.shape, what
        assert rel_err(got, r) < tol, "%s: relative error %g" % (what, rel_err(got, r))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_native_route_chunks_same_bits(dtype):
    """The native route gathers every pair at once, or runs of whole offsets where the buffers would be large,
    and sums each row's products in offset order either way: the same bits, forward, dinput and dfilter."""
    idx, res, _ = both_maps("subm3")
    m = as_maps(res, idx.shape[0])
    x, w, dy = fused_inputs(m, 24, 40, dtype)
    ops = hip_ops()
    debug = _backend.debug_library(ops)

    def run():
        return (ops.indice_conv(x, w, m.pair_in, m.pair_out, m.pair_offsets, m.num_out),
                *ops.indice_conv_backward(x, w, dy, m.pair_in, m.pair_out, m.pair_offsets))

    whole = run()
    old = debug.debug_native_chunk_rows(1)  # chunks of the fewest whole offsets that hold the largest one
    try:
        chunked = run()
    finally:
        debug.debug_native_chunk_rows(old)
    for what, a, b in zip(("forward", "dinput", "dfilter"), whole, chunked):
        assert torch.equal(a, b), what


@pytest.mark.parametrize("name", ["subm3", "conv_s2"])
def test_pair_positions_table(name):
    """pair_positions (GPU code and CPU op): the index within its offset of the pair writing each (row, offset),
    -1 where none; rows outside [0, num_dst) are skipped."""
    idx, res, _ = both_maps(name)
    m = as_maps(res, idx.shape[0])
    po = m.pair_offsets.tolist()
    kvol = len(po) - 1
    for dst, rows in ((m.pair_out, m.num_out), (m.pair_in, m.num_in)):
        want = torch.full((rows, kvol), -1, dtype=torch.int32)
        for k in range(kvol):
            for j, r in enumerate(dst[po[k]:po[k + 1]].tolist()):
                want[r, k] = j
        assert torch.equal(hip_ops().pair_positions(dst, m.pair_offsets, rows), want)
        assert torch.equal(cpu.pair_positions(dst, m.pair_offsets, rows), want)
    short = m.num_out // 2  # rows past it are skipped, not written out of bounds
    for ops in (hip_ops(), cpu):
        assert torch.equal(ops.pair_positions(m.pair_out, m.pair_offsets, short),
                           cpu.pair_positions(m.pair_out, m.pair_offsets, m.num_out)[:short])
    with pytest.raises(TypeError, match="pair_dst must be int32"):
        hip_ops().pair_positions(m.pair_out.long(), m.pair_offsets, m.num_out)
    with pytest.raises(ValueError, match="num_dst must be >= 0"):
        cpu.pair_positions(m.pair_out, m.pair_offsets, -1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16], ids=["f32", "f16"])
def test_native_route_given_positions_and_strided_filters(dtype):
    """The map's position tables passed in (as the layers pass them, made once per map) give the bits of the
    tables the op makes itself; filters read in place through the weight's permutation give those of contiguous
    ones; a table of the wrong shape is refused by name, and one of another map is bounded, not read past its
    offsets."""
    idx, res, _ = both_maps("subm3")
    m = as_maps(res, idx.shape[0])
    x, w, dy = fused_inputs(m, 24, 40, dtype)
    ops = hip_ops()
    args = (m.pair_in, m.pair_out, m.pair_offsets)
    out_pos = ops.pair_positions(m.pair_out, m.pair_offsets, m.num_out)
    in_pos = ops.pair_positions(m.pair_in, m.pair_offsets, m.num_in)
    want = (ops.indice_conv(x, w, *args, m.num_out), *ops.indice_conv_backward(x, w, dy, *args))
    got = (ops.indice_conv(x, w, *args, m.num_out, None, out_pos, in_pos),
           *ops.indice_conv_backward(x, w, dy, *args, None, in_pos))
    w_view = w.permute(2, 0, 1).contiguous().permute(1, 2, 0)  # [kvol, Cin, Cout] over a [Cout, kvol, Cin] weight
    assert not w_view.is_contiguous()
    strided = (ops.indice_conv(x, w_view, *args, m.num_out), *ops.indice_conv_backward(x, w_view, dy, *args))
    for what, a, b, c in zip(("forward", "dinput", "dfilter"), want, got, strided):
        assert torch.equal(a, b), what
        assert torch.allclose(a.float(), c.float(), rtol=1e-3 if dtype == torch.float16 else 1e-5, atol=1e-3), what
    with pytest.raises(ValueError, match=r"out_positions must be a contiguous \["):
        ops.indice_conv(x, w, *args, m.num_out, None, out_pos[:-1])
    with pytest.raises(ValueError, match=r"in_positions must be a contiguous \["):
        ops.indice_conv_backward(x, w, dy, *args, None, out_pos.t())
    with pytest.raises(TypeError, match="out_positions must be int32"):
        ops.indice_conv(x, w, *args, m.num_out, None, out_pos.long())
    garbage = torch.randint(-3, 1 << 20, out_pos.shape, dtype=torch.int32)
    assert torch.isfinite(ops.indice_conv(x, w, *args, m.num_out, None, garbage).float()).all()


# ---- pooling: the pair ops against the CPU route are in test_pool_gpu_code.py (every place of the GPU code) ----


# ---- pooling over neighbour tables (one launch per op): the CPU route's bits on the same map ----
def pool_tables(name, res, num_in):
    """(nbr, nbr_t) of a GPU-built map: the builder's table and its transpose (transpose_neighbour_table)."""
    ops = hip_ops()
    out_idx, info, table = res[0], res[4], res[5]
    if MAPS[name].get("subm", True):
        return table, ops.transpose_neighbour_table(table, num_in, info)
    return ops.transpose_neighbour_table(table, out_idx.shape[0], info), table


def pool_features(n, channels, dtype, seed=3):
    """Random features with ties (halves), all-negative rows, and exact +0 / -0 entries: the cases that decide
    which input takes a max pool's gradient."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, channels, generator=g)
    x[::3] = torch.round(x[::3] * 2) / 2
    x[1::4] = -x[1::4].abs() - 0.25
    x[2::9] = 0.0
    x[5::11] = -0.0
    return x.to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16],
                         ids=["f32", "f64", "f16", "bf16"])
@pytest.mark.parametrize("name", ["conv_k2s2", "conv_s2", "subm3", "conv4d", "subm5_kvol125", "subm2d_k12"])
@pytest.mark.parametrize("channels", [3, 33])
def test_pooling_tables_bit_exact(name, channels, dtype):
    idx, _, res = both_maps(name)
    out_idx, pin, pout, poff, info = res[:5]
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    nbr, nbr_t = pool_tables(name, res, n_in)
    x = pool_features(n_in, channels, dtype)
    dy = torch.randn(n_out, channels, generator=torch.Generator().manual_seed(4)).to(dtype)
    ops = hip_ops()
    yc = cpu.indice_maxpool(x, pin, pout, poff, n_out)
    dxc = cpu.indice_maxpool_backward(x, yc, dy, pin, pout, poff)
    ac, cntc = cpu.indice_avgpool(x, pin, pout, poff, n_out)
    dac = cpu.indice_avgpool_backward(dy, cntc, pin, pout, poff, n_in)
    assert (yc == 0).any() and (dxc == 0).any()  # clamped windows and inputs without gradient exist
    for map_info in (info, None):  # trusted host record; checked on the device
        y, arg = ops.indice_maxpool_table(x, nbr, nbr_t, map_info)
        assert y.dtype == dtype and torch.equal(y, yc)
        assert arg.shape == y.shape and arg.dtype == (torch.uint8 if nbr.shape[1] < 255 else torch.int32)
        dx = ops.indice_maxpool_table_backward(dy, arg, nbr_t, map_info)
        assert dx.dtype == dtype and torch.equal(dx, dxc)
        a, cnt = ops.indice_avgpool_table(x, nbr, nbr_t, map_info)
        assert torch.equal(cnt, cntc) and a.dtype == dtype and torch.equal(a, ac)
        da = ops.indice_avgpool_table_backward(dy, cnt, nbr_t, map_info)
        assert da.dtype == dtype and torch.equal(da, dac)


def test_pooling_tables_ties_take_the_first_offset():
    """Equal inputs in a window: the gradient goes to the first offset in ascending order, never two."""
    idx, _, res = both_maps("conv_k2s2")
    n_in, n_out = idx.shape[0], res[0].shape[0]
    nbr, nbr_t = pool_tables("conv_k2s2", res, n_in)
    x = torch.full((n_in, 2), 1.5)
    x[:, 1] = -1.0  # every window all negative: output 0, no gradient
    dy = torch.ones(n_out, 2)
    ops = hip_ops()
    y, arg = ops.indice_maxpool_table(x, nbr, nbr_t)
    assert torch.equal(y[:, 0], torch.full((n_out,), 1.5)) and torch.equal(y[:, 1], torch.zeros(n_out))
    first = torch.where(nbr >= 0, torch.arange(nbr.shape[1]), nbr.shape[1]).min(1).values
    assert torch.equal(arg[:, 0].long(), first) and (arg[:, 1] == 255).all()
    dx = ops.indice_maxpool_table_backward(dy, arg, nbr_t)
    assert dx[:, 0].sum() == n_out and torch.equal(dx[:, 1], torch.zeros(n_in))
    winners = torch.zeros(n_in)
    winners[nbr[torch.arange(n_out), first].long()] = 1
    assert torch.equal(dx[:, 0], winners)


def test_pooling_tables_nan():
    idx, _, res = both_maps("conv_s2")
    out_idx, pin, pout, poff, info = res[:5]
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    nbr, nbr_t = pool_tables("conv_s2", res, n_in)
    x = pool_features(n_in, 4, torch.float32)
    x[::5, 1] = float("nan")
    x[3] = float("nan")
    dy = torch.randn(n_out, 4, generator=torch.Generator().manual_seed(2))
    ops = hip_ops()
    y, arg = ops.indice_maxpool_table(x, nbr, nbr_t, info)
    yc = cpu.indice_maxpool(x, pin, pout, poff, n_out)
    assert torch.isnan(y).any() and torch.equal(torch.isnan(y), torch.isnan(yc))
    assert torch.equal(y.nan_to_num(), yc.nan_to_num())
    dx = ops.indice_maxpool_table_backward(dy, arg, nbr_t, info)
    assert torch.equal(dx, cpu.indice_maxpool_backward(x, yc, dy, pin, pout, poff))


def test_pooling_tables_int8():
    idx, _, res = both_maps("conv_s2")
    out_idx, pin, pout, poff, info = res[:5]
    nbr, nbr_t = pool_tables("conv_s2", res, idx.shape[0])
    x = torch.randint(-128, 128, (idx.shape[0], 9), generator=torch.Generator().manual_seed(1), dtype=torch.int8)
    y, arg = hip_ops().indice_maxpool_table(x, nbr, nbr_t, info)
    assert y.dtype == torch.int8 and arg.shape == (0, 9)  # inference only: no argmax
    assert torch.equal(y, cpu.indice_maxpool(x, pin, pout, poff, out_idx.shape[0]))


def test_pooling_tables_empty():
    ops = hip_ops()
    none = torch.full((3, 8), -1, dtype=torch.int32)
    no_rows = torch.zeros(0, 8, dtype=torch.int32)
    z = torch.zeros(0, dtype=torch.int32)
    poff = torch.zeros(9, dtype=torch.int64)
    x = torch.randn(0, 4)
    y, arg = ops.indice_maxpool_table(x, none, no_rows)
    assert torch.equal(y, cpu.indice_maxpool(x, z, z, poff, 3)) and arg.shape == (0, 4)
    a, cnt = ops.indice_avgpool_table(x, none, no_rows)
    ac, cntc = cpu.indice_avgpool(x, z, z, poff, 3)
    assert torch.equal(a, ac) and torch.equal(cnt, cntc)
    assert ops.indice_maxpool_table_backward(torch.randn(3, 4), arg, no_rows).shape == (0, 4)
    assert ops.indice_avgpool_table_backward(torch.randn(3, 4), cnt, no_rows).shape == (0, 4)
    # inputs feeding nothing get a zero gradient; zero channels still count
    y, arg = ops.indice_maxpool_table(torch.randn(5, 4), none, torch.full((5, 8), -1, dtype=torch.int32))
    assert torch.equal(y, torch.zeros(3, 4)) and (arg == 255).all()
    dx = ops.indice_maxpool_table_backward(torch.randn(3, 4), arg, torch.full((5, 8), -1, dtype=torch.int32))
    assert torch.equal(dx, torch.zeros(5, 4))
    idx, _, res = both_maps("conv_s2")
    nbr, nbr_t = pool_tables("conv_s2", res, idx.shape[0])
    a, cnt = ops.indice_avgpool_table(torch.randn(idx.shape[0], 0), nbr, nbr_t)
    assert a.shape == (nbr.shape[0], 0) and torch.equal(cnt, (nbr >= 0).sum(1).int())


def test_pooling_transpose_table():
    idx, c_res, res = both_maps("conv_s2")
    out_idx, pin, pout, poff, info, table = res
    n_in, n_out = idx.shape[0], out_idx.shape[0]
    ops = hip_ops()
    nbr = ops.transpose_neighbour_table(table, n_out, info)
    assert torch.equal(nbr, cpu.build_fused_map(pin, pout, poff, n_out, 1)[0])  # the table by output of the pairs
    assert torch.equal(ops.transpose_neighbour_table(nbr, n_in), table)  # checked on the device, same result
    bad = table.clone()
    bad[0, 0] = n_out
    with pytest.raises(ValueError, match="outside"):
        ops.transpose_neighbour_table(bad, n_out)
    twice = torch.tensor([[0, -1], [0, 1]], dtype=torch.int32)
    with pytest.raises(ValueError, match="twice"):
        ops.transpose_neighbour_table(twice, 2)
    with pytest.raises(ValueError, match="map_info"):
        ops.transpose_neighbour_table(table, n_out - 1, info)


# ---- voxelization: bit-exact ----
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("empty_mean", [False, True])
@pytest.mark.parametrize("max_voxels,max_points", [(10000, 5), (40, 3)])
def test_point_to_voxel_bit_exact(dtype, empty_mean, max_voxels, max_points):
    g = torch.Generator().manual_seed(5)
    pts = (torch.rand(700, 4, generator=g) * torch.tensor([8.0, 6.0, 4.0, 1.0]) - 0.5).to(dtype)
    args = ([0.5, 0.5, 0.5], [0.0, 0.0, 0.0, 2.0, 3.0, 4.0], [4, 6, 8], max_voxels, max_points, empty_mean)
    for got, ref in zip(hip_ops().point_to_voxel(pts, *args), cpu.point_to_voxel(pts, *args)):
        assert got.dtype == ref.dtype and torch.equal(got, ref)
    for got, ref in zip(hip_ops().point_to_voxel(pts[:0], *args), cpu.point_to_voxel(pts[:0], *args)):
        assert got.shape == ref.shape and got.dtype == ref.dtype


# ---- hash table ----
@pytest.mark.parametrize("key_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("value_dtype", [torch.int32, torch.int64, torch.float32])
def test_hash_table_ops(key_dtype, value_dtype):
    g = torch.Generator().manual_seed(11)
    cap = 512
    empty = torch.iinfo(key_dtype).max
    keys = torch.randint(0, 300, (200,), generator=g).to(key_dtype)  # repeats: first occurrence wins
    values = torch.randint(-50, 50, (200,), generator=g).to(value_dtype)
    query = torch.randint(0, 400, (150,), generator=g).to(key_dtype)
    upd = torch.randint(0, 400, (80,), generator=g).to(key_dtype)
    upd_v = torch.randint(-9, 9, (80,), generator=g).to(value_dtype)
    tables = []
    for ops in (hip_ops(), cpu):
        tk = torch.full((cap,), empty, dtype=key_dtype)
        tv = torch.zeros(cap, dtype=value_dtype)
        ops.hash_table_insert(tk, tv, keys, values)
        ops.hash_table_insert(tk, tv, keys[:10] + 1000, None)
        q = ops.hash_table_query(tk, tv, query)
        e = ops.hash_table_insert_exist_keys(tk, tv, upd, upd_v)
        q2 = ops.hash_table_query(tk, tv, torch.cat([query, upd]))
        tables.append((q, e, q2, tk, tv))
    (q, e, q2, tk, tv), (qc, ec, q2c, tkc, tvc) = tables
    assert torch.equal(q[0], qc[0]) and torch.equal(q[1], qc[1])
    assert torch.equal(e, ec)
    assert torch.equal(q2[0], q2c[0]) and torch.equal(q2[1], q2c[1])
    # slots may differ (probing order is an implementation detail); the stored mapping must not
    def mapping(k, v):
        keep = k != empty
        order = torch.argsort(k[keep])
        return k[keep][order], v[keep][order]
    for a, b in zip(mapping(tk, tv), mapping(tkc, tvc)):
        assert torch.equal(a, b)
