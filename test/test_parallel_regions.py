"""The native route's parallel regions on a busy machine: while regions have waited on a late thread, a region
runs its first tasks on the caller alone for a serial budget and opens the parallel region only for the tasks
left (csrc/native/region_stalls.h). Which thread runs a task must never change the bits: every layer, forward
and backward, is compared bitwise with the plain parallel run, with the budget forced so both paths run."""
import os
import subprocess
import sys
import time

import pytest
import torch

import spconv.pytorch as spconv_pt
from support.nets import mixed_layers_net
from support.reference import random_sparse

REGIONS, WAITED, STARTED_ALONE, FINISHED_ALONE, BUDGET_NS = range(5)


def _info():
    return torch.ops.spconv_debug.cpu_parallel_region_info()


def _set_budget(ns):
    torch.ops.spconv_debug.cpu_parallel_region_set_budget(ns)


def _run(net, x, budget_ns):
    """Forward + backward on 2 threads with the serial budget set before every layer's forward and before the
    backward (it decays within ~100 ms): output, input grad and every parameter grad."""
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    hooks = [m.register_forward_pre_hook(lambda *_: _set_budget(budget_ns)) for m in net.modules()]
    try:
        net.zero_grad()
        feats = x.features.clone().requires_grad_()
        y = net(x.replace_feature(feats))
        g = torch.linspace(-1, 1, y.features.numel(), dtype=y.features.dtype).reshape(y.features.shape)
        _set_budget(budget_ns)
        (y.features * g).sum().backward()
        return [y.features.detach().clone(), feats.grad.clone()] + [p.grad.clone() for p in net.parameters()]
    finally:
        for h in hooks:
            h.remove()
        _set_budget(0)
        torch.set_num_threads(saved)


# 1 ms: the large layers' regions run a few tasks alone and hand the rest to the parallel region; 50 ms: the
# whole region runs on the caller (the small layers of a busy machine).
@pytest.mark.slow
@pytest.mark.parametrize("budget_ns", [1_000_000, 50_000_000])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_bitwise_when_regions_start_on_the_caller(budget_ns, dtype):
    x = random_sparse(3, [64, 64, 32], 2, 16, density=0.2, dtype=dtype, seed=1)
    torch.manual_seed(0)
    net = mixed_layers_net(16, 32).to(dtype)
    ref = _run(net, x, 0)
    before = _info()
    got = _run(net, x, budget_ns)
    after = _info()
    for i, (a, b) in enumerate(zip(ref, got)):
        assert torch.equal(a, b), f"tensor {i} differs when regions start on the caller"
    started = after[STARTED_ALONE] - before[STARTED_ALONE]
    finished = after[FINISHED_ALONE] - before[FINISHED_ALONE]
    assert started > 0
    if budget_ns == 1_000_000:
        assert started > finished, "no region handed its remaining tasks to the parallel region"
    else:
        assert finished > 0


def test_budget_decays_and_resets():
    _set_budget(2_000_000)
    assert 0 < _info()[BUDGET_NS] <= 2_000_000
    time.sleep(0.4)  # 8 half-lives: under the smallest wait that counts
    assert _info()[BUDGET_NS] == 0
    _set_budget(2_000_000)
    _set_budget(0)
    assert _info()[BUDGET_NS] == 0


def test_quiet_regions_are_counted_and_start_parallel():
    _set_budget(0)
    x = random_sparse(3, [64, 64, 32], 2, 16, density=0.2, seed=2)
    conv = spconv_pt.SubMConv3d(16, 32, 3)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        before = _info()
        with torch.no_grad():
            conv(x)
        after = _info()
    finally:
        torch.set_num_threads(saved)
    assert after[REGIONS] > before[REGIONS]
    # A budget left over from a real wait (a busy test machine) may start a region alone; with none, none does.
    if before[BUDGET_NS] == 0 and after[WAITED] == before[WAITED]:
        assert after[STARTED_ALONE] == before[STARTED_ALONE]


def test_backward_runs_dinput_and_dfilter_in_one_region():
    """A layer small enough for the separate dX / dW passes runs both as one set of tasks: one parallel region
    (one barrier that can wait on a descheduled thread) per backward."""
    x = random_sparse(3, [32, 32, 16], 1, 16, density=0.1, seed=3)
    conv = spconv_pt.SubMConv3d(16, 32, 3, bias=False)
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        feats = x.features.clone().requires_grad_()
        y = conv(x.replace_feature(feats))
        _set_budget(0)
        before = _info()
        y.features.backward(torch.ones_like(y.features))
        after = _info()
    finally:
        torch.set_num_threads(saved)
    assert after[REGIONS] - before[REGIONS] == 1
    assert feats.grad is not None and conv.weight.grad is not None


def _kernel_maps(indices, shape, subm, threads, budget_ns):
    """get_indice_pairs on `threads` threads with the serial budget set just before: every output, and the region
    counters' change."""
    out_shape = shape if subm else [(s + 2 - 3) // 2 + 1 for s in shape]
    stride = [1, 1, 1] if subm else [2, 2, 2]
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        _set_budget(budget_ns)
        before = _info()
        got = torch.ops.spconv.get_indice_pairs(indices, 2, shape, out_shape, [3, 3, 3], stride, [1, 1, 1],
                                                [1, 1, 1], subm, False)
        after = _info()
    finally:
        _set_budget(0)
        torch.set_num_threads(saved)
    return [t.clone() for t in got if isinstance(t, torch.Tensor)], [a - b for a, b in zip(after, before)]


@pytest.mark.parametrize("subm", [True, False])
def test_small_kernel_maps_build_in_parallel_and_on_the_caller_when_busy(subm):
    """The row-block passes of a map build (a few thousand rows each) are run_tasks regions: a 10k-row map is
    parallel on a quiet machine, stays on the caller while regions have waited, and is the same either way."""
    x = random_sparse(3, [96, 96, 48], 2, 1, density=0.012, seed=4)
    assert 8_000 < x.indices.shape[0] < 14_000
    shape = list(x.spatial_shape)
    ref, _ = _kernel_maps(x.indices, shape, subm, 1, 0)
    quiet, quiet_counts = _kernel_maps(x.indices, shape, subm, 2, 0)
    busy, busy_counts = _kernel_maps(x.indices, shape, subm, 2, 50_000_000)
    for a, b, c in zip(ref, quiet, busy):
        assert torch.equal(a, b) and torch.equal(a, c)
    # Each pass is a parallel region; if one of them waited on a late thread (the test machine may be busy
    # itself), the passes after it run on the caller.
    if quiet_counts[WAITED] == 0:
        assert quiet_counts[REGIONS] >= 3 and quiet_counts[STARTED_ALONE] == 0
    else:
        assert quiet_counts[REGIONS] >= 1
    assert busy_counts[REGIONS] == 0 and busy_counts[STARTED_ALONE] == 0


def test_set_budget_rejects_negative():
    with pytest.raises(ValueError, match="ns must be >= 0"):
        _set_budget(-1)


def _budget_in_process_with(value):
    code = ("import torch, spconv.pytorch\n"
            "torch.ops.spconv_debug.cpu_parallel_region_set_budget(5_000_000)\n"
            "print(torch.ops.spconv_debug.cpu_parallel_region_info()[4])\n")
    env = dict(os.environ, SPCONV_CPU_SERIAL_START=value)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)


@pytest.mark.slow
def test_serial_start_can_be_switched_off():
    # SPCONV_CPU_SERIAL_START=0 (read once per process): every region parallel from its start, whatever waited.
    off, on = _budget_in_process_with("0"), _budget_in_process_with("1")
    assert off.returncode == 0 and off.stdout.strip() == "0"
    assert on.returncode == 0 and int(on.stdout) > 0


@pytest.mark.slow
def test_bad_serial_start_value_names_the_variable():
    bad = _budget_in_process_with("off")
    assert bad.returncode != 0
    assert "ValueError: SPCONV_CPU_SERIAL_START must be 0 or 1, got 'off'" in bad.stderr
