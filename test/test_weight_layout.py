"""The weight layout ops (CPU): spconv's weight [Cout, *kernel, Cin/groups] <-> the native route's filters
[kvol, groups, Cin/groups, Cout/groups], against the permute they replace, for every dimension, grouping and
dtype; their gradients (each is the other's), opcheck, torch.compile, bad input, empty and large weights."""
import pytest
import torch

from spconv.pytorch import _grouped, ops
from spconv.pytorch.functional import weight_to_filters

KERNELS = {1: [3], 2: [3, 2], 3: [3, 3, 3], 4: [2, 3, 1, 2]}
DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8]


def _permuted(weight, groups):
    """The reference: the permute the op replaces."""
    cout, cig = weight.shape[0], weight.shape[-1]
    return weight.reshape(groups, cout // groups, -1, cig).permute(2, 0, 3, 1).contiguous()


def _weight(cout, kernel, cig, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    w = torch.randn(cout, *kernel, cig, generator=g, dtype=torch.float64) * 100
    return w.to(dtype)


@pytest.mark.parametrize("nd", sorted(KERNELS))
@pytest.mark.parametrize("cout,cig,groups", [(8, 5, 1), (6, 3, 3), (16, 4, 4), (17, 19, 1), (40, 33, 2)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_matches_the_permute_and_inverts(nd, cout, cig, groups, dtype):
    w = _weight(cout, KERNELS[nd], cig, dtype)
    f = torch.ops.spconv.weight_to_filters(w, groups)
    assert f.dtype == dtype and f.is_contiguous()
    assert torch.equal(f, _permuted(w, groups))
    assert torch.equal(torch.ops.spconv.filters_to_weight(f, KERNELS[nd]), w)


@pytest.mark.parametrize("cout,cig,groups", [(256, 256, 1), (264, 150, 1), (512, 80, 2)])
def test_large_weights_run_in_parallel_with_the_same_result(cout, cig, groups):
    """Weights of 4.3-7 MB: the parallel path (tasks of rows through every offset), 1 and 2 threads, written with
    streaming stores where whole tiles align (AVX2: 256 x 256 both ways, 264 x 150 to filters with partial tiles
    at the edges, 512 x 80 in 2 groups both ways; AVX-512: 256 x 256 and 512 x 80). Raw bits, NaN payloads
    included."""
    g = torch.Generator().manual_seed(cout)
    bits = torch.randint(-2**31, 2**31 - 1, (cout, 3, 3, 3, cig), dtype=torch.int32, generator=g)
    w = bits.view(torch.float32)
    ref = _permuted(bits, groups)
    old = torch.get_num_threads()
    try:
        for threads in (1, 2):
            torch.set_num_threads(threads)
            f = torch.ops.spconv.weight_to_filters(w, groups)
            assert torch.equal(f.view(torch.int32), ref)
            assert torch.equal(torch.ops.spconv.filters_to_weight(f, [3, 3, 3]).view(torch.int32), bits)
    finally:
        torch.set_num_threads(old)


def test_non_contiguous_weight():
    base = _weight(12, [3, 3, 3], 20)
    w = base[:, :, :, :, ::2]  # [12, 3, 3, 3, 10], strided
    assert not w.is_contiguous()
    assert torch.equal(torch.ops.spconv.weight_to_filters(w, 4), _permuted(w, 4))


def test_wrappers_use_the_op_on_the_cpu():
    w = _weight(24, [3, 3, 3], 8)
    with torch.profiler.profile() as prof:
        weight_to_filters(w)
        _grouped.weight_to_grouped_filters(w, 3)
    assert sum(e.name == "spconv::weight_to_filters" for e in prof.events()) == 2
    assert torch.equal(weight_to_filters(_weight(24, [3, 3, 3], 24)), _permuted(_weight(24, [3, 3, 3], 24), 1)[:, 0])
    assert torch.equal(_grouped.weight_to_grouped_filters(w, 3), _permuted(w, 3))
    assert torch.equal(ops.weight_to_filters(w, 3), _permuted(w, 3))


@pytest.mark.parametrize("groups", [1, 4])
def test_gradients_match_the_permute(groups):
    w = _weight(16, [3, 2, 3], 8, torch.float64).requires_grad_()
    w_ref = w.detach().clone().requires_grad_()
    g = torch.randn(18, groups, 8, 16 // groups, dtype=torch.float64)
    ops.weight_to_filters(w, groups).backward(g)
    _permuted(w_ref, groups).backward(g)
    assert torch.equal(w.grad, w_ref.grad)
    # The inverse's gradient is the forward op.
    f = torch.randn(18, groups, 8, 16 // groups, dtype=torch.float64, requires_grad=True)
    gw = torch.randn(16, 3, 2, 3, 8, dtype=torch.float64)
    torch.ops.spconv.filters_to_weight(f, [3, 2, 3]).backward(gw)
    assert torch.equal(f.grad, _permuted(gw, groups))


def test_gradcheck():
    w = _weight(6, [2, 3], 4, torch.float64).requires_grad_()
    assert torch.autograd.gradcheck(lambda t: torch.ops.spconv.weight_to_filters(t, 2), (w,))
    f = torch.randn(6, 2, 4, 3, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda t: torch.ops.spconv.filters_to_weight(t, [2, 3]), (f,))


def test_opcheck():
    w = _weight(12, [3, 3, 3], 4).requires_grad_()
    torch.library.opcheck(torch.ops.spconv.weight_to_filters.default, (w, 3))
    f = torch.randn(27, 3, 4, 4, requires_grad=True)
    torch.library.opcheck(torch.ops.spconv.filters_to_weight.default, (f, [3, 3, 3]))


def test_compile():
    w = _weight(16, [3, 3, 3], 8).requires_grad_()
    compiled = torch.compile(lambda t: ops.weight_to_filters(t, 2) * 2, fullgraph=True, backend="aot_eager")
    out = compiled(w)
    assert torch.equal(out, _permuted(w.detach(), 2) * 2)
    out.sum().backward()
    assert torch.equal(w.grad, torch.full_like(w, 2))


@pytest.mark.parametrize("cout,cig,groups", [(0, 4, 1), (8, 0, 2), (0, 0, 1)])
def test_empty_weights(cout, cig, groups):
    w = torch.empty(cout, 3, 3, 3, cig)
    f = torch.ops.spconv.weight_to_filters(w, groups)
    assert f.shape == (27, groups, cig, cout // groups)
    assert torch.ops.spconv.filters_to_weight(f, [3, 3, 3]).shape == w.shape


def test_bad_input_names_the_argument():
    w = torch.randn(8, 3, 3, 3, 4)
    with pytest.raises(ValueError, match="groups must be >= 1"):
        torch.ops.spconv.weight_to_filters(w, 0)
    with pytest.raises(ValueError, match=r"weight: Cout \(8\) must be divisible by groups \(3\)"):
        torch.ops.spconv.weight_to_filters(w, 3)
    with pytest.raises(ValueError, match="weight must be"):
        torch.ops.spconv.weight_to_filters(torch.randn(8, 4), 1)
    with pytest.raises(ValueError, match="weight: dtype"):
        torch.ops.spconv.weight_to_filters(torch.randn(8, 3, 4, dtype=torch.complex128), 1)
    f = torch.randn(27, 1, 4, 8)
    with pytest.raises(ValueError, match="filters must be"):
        torch.ops.spconv.filters_to_weight(f[0], [3, 3, 3])
    with pytest.raises(ValueError, match="has volume 8, but filters has 27 offsets"):
        torch.ops.spconv.filters_to_weight(f, [2, 2, 2])
    with pytest.raises(ValueError, match="kernel_size entries must be >= 1"):
        torch.ops.spconv.filters_to_weight(f, [27, 0])
    with pytest.raises(ValueError, match="kernel_size must have at least one entry"):
        torch.ops.spconv.filters_to_weight(f, [])
