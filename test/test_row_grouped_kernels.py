"""The CPU kernels that walk the pairs row by row (or block of rows by block): max pooling (bitwise against an
offset-by-offset reference of its documented semantics) and the convolution, direct for few input channels and
gather-GEMM-scatter for more (against dense F.conv3d), all bitwise independent of the thread count."""
import pytest
import torch

import spconv.pytorch as spconv
from support.reference import dense_reference, random_sparse

ops = torch.ops.spconv
SHAPE = [12, 11, 10]


def _bits(t):
    return t.view(torch.int64 if t.dtype == torch.float64 else torch.int32)


def _bitwise_equal(a, b):
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(_bits(a), _bits(b))


def _with_threads(threads, fn):
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(saved)


def _pool_pairs(kernel, stride, padding, seed=0):
    x = random_sparse(3, SHAPE, 2, 1, density=0.35, seed=seed)
    out_shape = [(s + 2 * padding - kernel) // stride + 1 for s in SHAPE]
    out_ind, pin, pout, po, _, _ = ops.get_indice_pairs(x.indices, 2, SHAPE, out_shape, [kernel] * 3, [stride] * 3,
                                                  [padding] * 3, [1] * 3, False, False)
    return x.indices.shape[0], out_ind.shape[0], pin, pout, po


def _maxpool_reference(x, pin, pout, po, num_out):
    """Offset by offset from 0: an input replaces the output when greater or NaN; the gradient of each output
    channel goes to the first offset's input equal to it (or NaN with it)."""
    out = torch.zeros(num_out, x.shape[1], dtype=x.dtype)
    for k in range(po.numel() - 1):
        i, o = pin[po[k]:po[k + 1]].long(), pout[po[k]:po[k + 1]].long()
        xi, cur = x[i], out[o]
        out[o] = torch.where((xi > cur) | xi.isnan(), xi, cur)
    return out


def _maxpool_backward_reference(x, out, dout, pin, pout, po):
    din = torch.zeros_like(x)
    claimed = torch.zeros(out.shape, dtype=torch.bool)
    for k in range(po.numel() - 1):
        i, o = pin[po[k]:po[k + 1]].long(), pout[po[k]:po[k + 1]].long()
        xi, yo = x[i], out[o]
        take = ~claimed[o] & ((xi == yo) | (xi.isnan() & yo.isnan()))
        din[i] = torch.where(take, din[i] + dout[o], din[i])
        claimed[o] |= take
    return din


def _pool_features(n, c, dtype, seed):
    """Small integers (many ties), some -0.0 and NaN."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-3, 4, (n, c), generator=g).to(dtype)
    x[torch.rand(n, c, generator=g) < 0.1] = -0.0
    x[torch.rand(n, c, generator=g) < 0.02] = float("nan")
    return x


# (kernel, stride, padding): windows that don't overlap (every input feeds one output) and that do.
POOLS = {"disjoint": (2, 2, 0), "overlapping": (3, 2, 1), "stride1": (3, 1, 1)}


@pytest.mark.parametrize("pool", sorted(POOLS))
@pytest.mark.parametrize("channels", [1, 7, 64])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_max_pool_matches_offset_order_reference_bitwise(pool, channels, dtype):
    n_in, n_out, pin, pout, po = _pool_pairs(*POOLS[pool])
    x = _pool_features(n_in, channels, dtype, seed=channels)
    ref = _maxpool_reference(x, pin, pout, po, n_out)
    dout = torch.randn(ref.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    dref = _maxpool_backward_reference(x, ref, dout, pin, pout, po)
    for threads in (1, 2):
        y = _with_threads(threads, lambda: ops.indice_maxpool(x, pin, pout, po, n_out))
        dx = _with_threads(threads, lambda: ops.indice_maxpool_backward(x, y, dout, pin, pout, po))
        assert _bitwise_equal(y, ref), f"forward differs with {threads} threads"
        assert _bitwise_equal(dx, dref), f"backward differs with {threads} threads"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_max_pool_low_precision_matches_fp32(dtype):
    n_in, n_out, pin, pout, po = _pool_pairs(*POOLS["overlapping"])
    x = _pool_features(n_in, 9, torch.float32, seed=3).to(dtype)
    y = ops.indice_maxpool(x, pin, pout, po, n_out)
    y32 = ops.indice_maxpool(x.float(), pin, pout, po, n_out)
    assert y.dtype == dtype and _bitwise_equal(y.float(), y32)
    dout = torch.randn(y.shape, generator=torch.Generator().manual_seed(2)).to(dtype)
    dx = ops.indice_maxpool_backward(x, y, dout, pin, pout, po)
    dx32 = ops.indice_maxpool_backward(x.float(), y32, dout.float(), pin, pout, po)
    assert dx.dtype == dtype and torch.equal(dx, dx32.to(dtype))


# The direct route takes up to 8 input channels; 9 and 24 check the GEMM route (blocks of output rows, dW
# partials per block of input rows) next to it. Output channel counts cover a partial vector (5, 13) and more
# than one 64-column tile (70).
CONVS = [(1, 5), (3, 16), (3, 70), (4, 13), (8, 32), (9, 13), (24, 40)]


def _layer(kind, cin, cout):
    torch.manual_seed(cin * 100 + cout)
    if kind == "subm":
        return spconv.SubMConv3d(cin, cout, 3, bias=False)
    return spconv.SparseConv3d(cin, cout, 3, 2, 1, bias=False)


def _conv_run(layer, x, threads):
    def run():
        layer.zero_grad()
        feats = x.features.clone().requires_grad_(True)
        y = layer(x.replace_feature(feats))
        g = torch.linspace(-1, 1, y.features.numel(), dtype=y.features.dtype).reshape(y.features.shape)
        (y.features * g).sum().backward()
        return y, g, feats.grad.clone(), layer.weight.grad.clone()
    return _with_threads(threads, run)


@pytest.mark.parametrize("kind", ["subm", "conv"])
@pytest.mark.parametrize("cin,cout", CONVS)
def test_few_input_channel_conv_matches_dense(kind, cin, cout):
    x = random_sparse(3, SHAPE, 2, cin, density=0.3, seed=cin + cout)
    layer = _layer(kind, cin, cout)
    y, g, dx, dw = _conv_run(layer, x, 2)
    # Dense reference in FP64 through autograd: forward, dinput and dfilter.
    xd = x.replace_feature(x.features.double().requires_grad_(True))
    w = layer.weight.detach().double().requires_grad_(True)
    ref = dense_reference(kind, xd, w, y.indices, y.spatial_shape, [2] * 3, [1] * 3, [1] * 3)
    (ref * g.double()).sum().backward()
    torch.testing.assert_close(y.features.double(), ref.detach(), atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dx.double(), xd.features.grad, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(dw.double(), w.grad, atol=1e-4, rtol=1e-4)
    one = _conv_run(layer, x, 1)
    for name, a, b in (("forward", y.features, one[0].features), ("dinput", dx, one[2]), ("dfilter", dw, one[3])):
        assert _bitwise_equal(a, b), f"{name} differs between 1 and 2 threads"


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64])
def test_few_input_channel_conv_dtypes(dtype):
    x = random_sparse(3, SHAPE, 1, 3, density=0.3, seed=4)
    layer = _layer("subm", 3, 13)
    ref_y, _, ref_dx, ref_dw = _conv_run(layer, x, 2)
    layer = layer.to(dtype)
    y, _, dx, dw = _conv_run(layer, x.replace_feature(x.features.to(dtype)), 2)
    assert y.features.dtype == dx.dtype == dw.dtype == dtype
    tol = 1e-4 if dtype == torch.float64 else 5e-2
    for a, b in ((y.features, ref_y.features), (dx, ref_dx), (dw, ref_dw)):
        scale = b.abs().max().item()
        assert (a.double() - b.double()).abs().max().item() <= tol * max(scale, 1.0)
