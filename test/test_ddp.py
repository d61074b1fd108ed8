"""DistributedDataParallel on 2 processes (gloo on CPU; nccl/rccl on 2 GPUs where present): gradients and a few
SGD steps equal single-process training on the combined batch; with SparseSyncBatchNorm the statistics (and
running statistics) span both processes, also when one rank has no active sites."""
import datetime
import os
import sys

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import spconv.pytorch as spconv

SHAPE = [8, 8, 8]
STEPS = 3


def _model(sync_bn: bool):
    torch.manual_seed(0)
    layers = [spconv.SubMConv3d(3, 8, 3, indice_key="a")]
    if sync_bn:
        layers.append(spconv.SparseSyncBatchNorm(8))
    layers += [torch.nn.ReLU(), spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d"), spconv.SubMConv3d(8, 8, 3),
               spconv.SparseInverseConv3d(8, 4, 3, indice_key="d")]
    return spconv.SparseSequential(*layers)


def _batch(samples, device="cpu"):
    """Samples (fixed by seed) stacked into one SparseConvTensor on ``device``, batch index = position in
    ``samples``; no samples gives a tensor with no active sites."""
    feats, idx = [torch.zeros(0, 3)], [torch.zeros(0, 4, dtype=torch.long)]
    for b, s in enumerate(samples):
        g = torch.Generator().manual_seed(100 + s)
        flat = torch.randperm(512, generator=g)[:40 + 5 * s]
        coords = torch.stack([flat // 64, flat // 8 % 8, flat % 8], 1)
        idx.append(torch.cat([torch.full((coords.shape[0], 1), b), coords], 1))
        feats.append(torch.randn(coords.shape[0], 3, generator=g))
    return spconv.SparseConvTensor(torch.cat(feats).to(device), torch.cat(idx).int().to(device), SHAPE,
                                   max(1, len(samples)))


def _loss(y, scale):
    # Per-sample loss summed, times world_size / total samples: DDP's gradient average over the ranks then
    # equals the gradient of the mean loss over the combined batch.
    return y.features.square().sum() * scale


def _train(model, samples, wrap=None, scale=None, device="cpu"):
    model = model.to(device)
    net = model if wrap is None else wrap(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scale = 1.0 / len(samples) if scale is None else scale
    grads = []
    for _ in range(STEPS):
        opt.zero_grad()
        _loss(net(_batch(samples, device)), scale).backward()
        grads.append([p.grad.cpu() for p in model.parameters()])
        opt.step()
    return grads, [p.detach().cpu() for p in model.parameters()], [b.cpu() for b in model.buffers()]


# name -> (SparseSyncBatchNorm in the net, samples of rank 0, samples of rank 1)
SCENARIOS = {"plain": (False, [0, 1], [2, 3]), "sync_bn": (True, [0, 1], [2, 3]),
             "sync_bn_empty_rank": (True, [0, 1, 2, 3], [])}


def _worker(rank, backend, init_file, out_dir):
    torch.set_num_threads(1)
    device = f"cuda:{rank}" if backend == "nccl" else "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
    # A collective that one rank skips fails after the timeout instead of hanging the test.
    dist.init_process_group(backend, init_method=f"file://{init_file}", rank=rank, world_size=2,
                            timeout=datetime.timedelta(seconds=60))
    try:
        for name, (sync_bn, *per_rank) in SCENARIOS.items():
            total = sum(len(s) for s in per_rank)
            result = _train(_model(sync_bn), per_rank[rank], lambda m: torch.nn.parallel.DistributedDataParallel(m),
                            scale=2.0 / total, device=device)
            torch.save(result, os.path.join(out_dir, f"{name}_rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


_NCCL = [pytest.mark.gpu, pytest.mark.skipif(not (dist.is_available() and dist.is_nccl_available() and torch.cuda.device_count() >= 2),
                           reason="nccl/rccl DDP needs 2 GPUs")]


@pytest.fixture(scope="module", params=["gloo", pytest.param("nccl", marks=_NCCL)])
def ddp_results(request, tmp_path_factory):
    """One 2-process run per backend (process start-up dominates the time) trains every scenario."""
    out = tmp_path_factory.mktemp(f"ddp_{request.param}")
    mp.spawn(_worker, args=(request.param, str(out / "init"), str(out)), nprocs=2, join=True)
    return request.param, out


@pytest.mark.skipif(not dist.is_available() or sys.platform == "win32", reason="needs torch.distributed (gloo)")
@pytest.mark.parametrize("name", list(SCENARIOS))
def test_ddp_matches_single_process(ddp_results, name):
    backend, ddp_dir = ddp_results
    sync_bn, *per_rank = SCENARIOS[name]
    device = "cuda:0" if backend == "nccl" else "cpu"
    grads_ref, params_ref, buffers_ref = _train(_model(sync_bn), sorted(sum(per_rank, [])), device=device)
    if sync_bn:
        assert len(buffers_ref) == 3  # running_mean, running_var, num_batches_tracked
        assert buffers_ref[2].item() == STEPS
    for rank in (0, 1):
        grads, params, buffers = torch.load(ddp_dir / f"{name}_rank{rank}.pt")
        for step, (g, g_ref) in enumerate(zip(grads, grads_ref)):
            for a, b in zip(g, g_ref):
                torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5, msg=lambda m: f"step {step}: {m}")
        for a, b in zip(params, params_ref):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)
        # BN running statistics (unbiased running_var over the combined batch) and num_batches_tracked.
        assert len(buffers) == len(buffers_ref)
        for a, b in zip(buffers, buffers_ref):
            torch.testing.assert_close(a, b, atol=1e-5, rtol=1e-5)


def test_sync_bn_module_surface():
    """spconv 2.x constructor and state_dict keys; a sparse-aware module; single process = BatchNorm1d."""
    bn = spconv.SparseSyncBatchNorm(4, eps=1e-3, momentum=0.2, affine=True, track_running_stats=True,
                                    process_group=None)
    assert sorted(bn.state_dict()) == sorted(torch.nn.BatchNorm1d(4).state_dict())
    assert isinstance(bn, torch.nn.modules.batchnorm._BatchNorm) and spconv.is_spconv_module(bn)
    ref = torch.nn.BatchNorm1d(4, eps=1e-3, momentum=0.2)
    x = torch.randn(30, 4)
    t = spconv.SparseConvTensor(x, torch.stack([torch.zeros(30), torch.arange(30), torch.zeros(30)], 1).int(),
                                [30, 1], 1)
    torch.testing.assert_close(bn(t).features, ref(x))
    torch.testing.assert_close(bn.running_var, ref.running_var)
    bn.eval(), ref.eval()
    torch.testing.assert_close(bn(x), ref(x))
    empty = spconv.SparseConvTensor(x[:0], t.indices[:0], [30, 1], 1)
    assert bn.train()(empty).features.shape == (0, 4)  # not distributed: passes through, stats untouched
    assert bn.num_batches_tracked.item() == 1
    conv = spconv.SparseSyncBatchNorm.convert_sync_batchnorm(spconv.SparseSequential(spconv.SparseBatchNorm(4)))
    assert type(conv[0]) is spconv.SparseSyncBatchNorm
