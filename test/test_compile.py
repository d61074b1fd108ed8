"""torch.compile on a model with sparse layers: runs, matches eager forward and backward, and breaks the graph only
where a kernel map is built (get_indice_pairs has a data-dependent output size), unless dynamo captures such ops
(capture_dynamic_output_shape_ops): then inference models compile with fullgraph=True."""
import os

import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from support.reference import random_sparse
from support.export_nets import EveryLayer
from support.export_nets import inputs as every_layer_inputs

SHAPE = [8, 8, 8]


class Model(nn.Module):
    """Dense tensors in, dense tensors out, so torch.compile sees the whole sparse network."""

    def __init__(self):
        super().__init__()
        self.net = spconv.SparseSequential(
            spconv.SubMConv3d(3, 8, 3, indice_key="a"), nn.BatchNorm1d(8), nn.ReLU(),
            spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="down"), spconv.SubMConv3d(8, 8, 3),
            spconv.SparseMaxPool3d(1, 1),
            spconv.SparseInverseConv3d(8, 4, 3, indice_key="down"))

    def forward(self, features, indices):
        return self.net(spconv.SparseConvTensor(features, indices, SHAPE, 2)).features


def _inputs(seed=0):
    x = random_sparse(3, SHAPE, 2, 3, density=0.2, seed=seed)
    return x.features, x.indices


def test_graph_breaks_only_at_kernel_map_building():
    torch._dynamo.reset()
    torch.manual_seed(0)
    explanation = torch._dynamo.explain(Model())(*_inputs())
    reasons = [str(b.reason) for b in explanation.break_reasons]
    assert reasons, "expected breaks at kernel-map building"
    for r in reasons:
        assert "spconv.get_indice_pairs" in r, r
    assert len(reasons) <= 3  # one per kernel map built (subm a, conv down, the unkeyed subm; pool reuses none)


@pytest.mark.slow
@pytest.mark.parametrize("backend", [
    "aot_eager",
    pytest.param("inductor", marks=pytest.mark.skipif(os.getenv("SPCONV_TEST_INDUCTOR") != "1",
                                                      reason="inductor compiles C++ (minutes on 2 cores); "
                                                             "set SPCONV_TEST_INDUCTOR=1")),
])
def test_compiled_matches_eager(backend):
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = Model()
    compiled = torch.compile(model, backend=backend)
    for seed in (0, 1):  # a second input with other sizes: recompiles or dynamic shapes, same numbers
        feats, idx = _inputs(seed)
        f_eager = feats.clone().requires_grad_()
        f_comp = feats.clone().requires_grad_()
        model.zero_grad()
        ref = model(f_eager, idx)
        ref.square().sum().backward()
        ref_grads = [f_eager.grad] + [p.grad.clone() for p in model.parameters()]
        model.zero_grad()
        out = compiled(f_comp, idx)
        out.square().sum().backward()
        torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5)
        for a, b in zip([f_comp.grad] + [p.grad for p in model.parameters()], ref_grads):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_no_graph_break_when_dynamic_output_shapes_are_captured():
    torch._dynamo.reset()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True):
        explanation = torch._dynamo.explain(Model().eval())(*_inputs())
    assert explanation.graph_break_count == 0, [str(b.reason) for b in explanation.break_reasons]


@pytest.mark.slow
def test_fullgraph_inference_matches_eager_bitwise():
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = EveryLayer().eval()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad():
        compiled = torch.compile(model, fullgraph=True, backend="aot_eager", dynamic=True)
        for seed, density in ((0, 0.3), (1, 0.1)):
            feats, idx = every_layer_inputs(seed, density)
            out, ref = compiled(feats, idx), model(feats, idx)
            assert all(torch.equal(a, b) for a, b in zip(out, ref)), (seed, density)


@pytest.mark.slow
def test_fullgraph_inductor_matches_eager_bitwise_inside_bitwise_inductor():
    from spconv import deploy
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = EveryLayer().eval()
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True), torch.no_grad(), \
            deploy.bitwise_inductor():
        compiled = torch.compile(model, fullgraph=True, dynamic=True)
        for seed, density in ((0, 0.3), (1, 0.1)):  # compiled at the first call, inside the context
            feats, idx = every_layer_inputs(seed, density)
            out, ref = compiled(feats, idx), model(feats, idx)
            assert all(torch.equal(a, b) for a, b in zip(out, ref)), (seed, density)


def test_bitwise_inductor_reaches_a_table_copied_by_an_earlier_compile():
    """Inductor compiles with a cached copy of its decomposition table (made by the process's first compile):
    bitwise_inductor's edit must reach the next compile even after that copy exists, and be undone on exit.
    Checked on the table itself, so it runs without compiling C++."""
    from spconv import deploy
    from torch._inductor.decomposition import decompositions, select_decomp_table
    op = torch.ops.aten._native_batch_norm_legit_no_training.default
    if op not in decompositions:
        pytest.skip("this torch has no Inductor decomposition of eval-mode batch norm")
    assert op in select_decomp_table()  # the copy an earlier compile makes
    with deploy.bitwise_inductor():
        assert op not in select_decomp_table()
    assert op in select_decomp_table()


def test_compiled_dense_matches_eager_with_its_gradient():
    torch._dynamo.reset()
    feats, idx = _inputs(seed=3)

    def to_dense(f, i):
        return spconv.SparseConvTensor(f, i, SHAPE, 2).dense()

    compiled = torch.compile(to_dense, backend="aot_eager", fullgraph=True)
    grad = torch.randn(2, 3, *SHAPE)
    results = []
    for fn in (to_dense, compiled):
        f = feats.clone().requires_grad_()
        out = fn(f, idx)
        out.backward(grad)
        results.append((out, f.grad))
    assert torch.equal(results[0][0], results[1][0]) and torch.equal(results[0][1], results[1][1])
