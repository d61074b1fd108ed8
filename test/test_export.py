"""torch.export of sparse networks with a dynamic voxel count: every layer kind, the kernel-map sizes as
unbacked symbols, and ep.module() giving eager's bits on inputs of other sizes."""
import pytest
import torch
from torch import nn

import spconv.pytorch as spconv
from spconv import deploy
from support.export_nets import EveryLayer, inputs


def _equal(a, b):
    return len(a) == len(b) and all(x.shape == y.shape and torch.equal(x, y) for x, y in zip(a, b))


@pytest.fixture(scope="module")
def exported():
    torch.manual_seed(0)
    model = EveryLayer().eval()
    return model, deploy.export(model, *inputs(0, 0.3))


@pytest.mark.slow
def test_every_layer_kind_matches_eager_bitwise_at_other_sizes(exported):
    model, ep = exported
    run = ep.module()
    with torch.no_grad():
        for seed, density in ((0, 0.3), (1, 0.1), (2, 0.45)):
            feats, idx = inputs(seed, density)
            assert _equal(run(feats, idx), model(feats, idx)), (seed, density)


def test_kernel_maps_are_graph_ops_with_unbacked_sizes(exported):
    _, ep = exported
    targets = [n.target for n in ep.graph.nodes if n.op == "call_function"]
    # one per map built: subm "s0" (shared by three convs), conv "d", max pool "mp", avg pool, transposed conv
    assert targets.count(torch.ops.spconv.get_indice_pairs.default) == 5
    unbacked = [s for s in ep.range_constraints if str(s).startswith("u")]
    assert unbacked, ep.range_constraints  # output voxel counts and pair counts, never Python ints
    (n_sym,) = [s for s in ep.range_constraints if not str(s).startswith("u")]
    assert ep.range_constraints[n_sym].lower == 1  # the voxel count stays a symbol (no specialization)


def test_voxel_count_is_dynamic_not_specialized():
    torch.manual_seed(0)
    net = spconv.SparseSequential(spconv.SparseConv3d(3, 4, 3, 2, 1), nn.BatchNorm1d(4), nn.ReLU())

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = net

        def forward(self, features, indices):
            return self.net(spconv.SparseConvTensor(features, indices, [10, 10, 12], 2)).features

    model = M().eval()
    ep = deploy.export(model, *inputs(0, 0.3))
    with torch.no_grad():
        feats, idx = inputs(3, 0.02)  # far fewer voxels than at export
        assert torch.equal(ep.module()(feats, idx), model(feats, idx))


def test_sparse_add_refuses_to_trace_with_a_reason():
    class M(nn.Module):
        def forward(self, features, indices):
            a = spconv.SparseConvTensor(features, indices, [10, 10, 12], 2)
            b = spconv.SparseConvTensor(features[:5], indices[:5], [10, 10, 12], 2)
            return spconv.AddTableMisaligned()([a, b]).features

    with pytest.raises(NotImplementedError, match="depend on which operand"):
        deploy.export(M(), *inputs(0, 0.3))


@pytest.mark.parametrize("bad, match", [((torch.zeros(3), torch.zeros(3, 4, dtype=torch.int32)), "features"),
                                        ((torch.zeros(3, 3), torch.zeros(3, dtype=torch.int32)), "indices")])
def test_export_names_the_bad_argument(bad, match):
    with pytest.raises(ValueError, match=match):
        deploy.export(EveryLayer().eval(), *bad)


def test_checksum_sees_one_bit():
    t = torch.linspace(-1, 1, 2000)
    u = t.clone()
    u.view(torch.int32)[1234] ^= 1
    assert deploy.checksum(t) != deploy.checksum(u)
    assert deploy.checksum(t) == deploy.checksum(t.clone())


def test_record_voxel_count_updates_the_exported_buffer():
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.conv = spconv.SparseConv3d(3, 4, 3, 2, 1, record_voxel_count=True)

        def forward(self, features, indices):
            return self.conv(spconv.SparseConvTensor(features, indices, [10, 10, 12], 2)).indices

    ep = deploy.export(M().eval(), *inputs(0, 0.1))
    run = ep.module()
    run.conv.max_num_voxels_during_training.zero_()
    out = run(*inputs(1, 0.3))
    assert int(run.conv.max_num_voxels_during_training) == out.shape[0] > 0


def test_layers_after_an_empty_output_run_on_zero_rows():
    # A stride-3 kernel-2 conv has no output for an input at coordinate 2: the traced graph still runs the
    # BatchNorm/ReLU/SubM after it (eager skips the dense modules), on zero rows, with the same result.
    torch.manual_seed(0)

    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.net = spconv.SparseSequential(spconv.SparseConv3d(3, 4, 2, 3), nn.BatchNorm1d(4), nn.ReLU(),
                                               spconv.SubMConv3d(4, 4, 3))

        def forward(self, features, indices):
            out = self.net(spconv.SparseConvTensor(features, indices, [10, 10, 12], 2))
            return out.features, out.dense()

    model = M().eval()
    run = deploy.export(model, *inputs(0, 0.3)).module()
    feats, idx = torch.randn(1, 3), torch.tensor([[0, 2, 2, 2]], dtype=torch.int32)
    with torch.no_grad():
        ref, out = model(feats, idx), run(feats, idx)
    assert ref[0].shape[0] == 0 and _equal(out, ref)


def test_batch_size_argument_is_a_constant_of_the_graph():
    from support.reference import random_sparse
    from spconv.benchmark.deploy_models import build
    model = build("basic", 3, [64, 64, 64])  # forward(features, indices, batch_size)
    x = random_sparse(3, [64, 64, 64], 2, 3, density=0.002, seed=0)
    run = deploy.export(model, x.features, x.indices, 2).module()
    y = random_sparse(3, [64, 64, 64], 2, 3, density=0.003, seed=1)
    with torch.no_grad():
        assert _equal(run(y.features, y.indices, 2), model(y.features, y.indices, 2))
    with pytest.raises(Exception, match="batch_size"):
        run(y.features, y.indices, 3)
