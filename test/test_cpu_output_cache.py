"""The cache of large CPU op outputs (spconv.output_cache): a freed output's memory serves the next output of a
similar size, the ops give the same results on recycled (dirty) memory as on fresh memory, the outputs behave as
ordinary tensors, and SPCONV_CPU_OUTPUT_CACHE_MB bounds what is kept."""
import io
import os
import subprocess
import sys

import pytest
import torch

import spconv.pytorch as spconv
from spconv import output_cache

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
C = 64


def _scene(n=20000, seed=0):
    """n voxels: outputs of n x 64 floats (5 MB) are large enough for the cache."""
    g = torch.Generator().manual_seed(seed)
    coords = torch.unique(torch.randint(0, 64, (3 * n, 3), generator=g, dtype=torch.int32), dim=0)[:n]
    idx = torch.cat([torch.zeros(len(coords), 1, dtype=torch.int32), coords], 1)
    return spconv.SparseConvTensor(torch.randn(len(idx), C, generator=g), idx, [64, 64, 64], 1)


LAYERS = {
    "subm": lambda: spconv.SubMConv3d(C, C, 3, bias=False, indice_key="s"),  # gather-GEMM-scatter, zeroed output
    "depthwise": lambda: spconv.SubMConv3d(C, C, 3, groups=C, bias=False, indice_key="s"),  # written once
    "groups4": lambda: spconv.SubMConv3d(C, C, 3, groups=4, bias=False, indice_key="s"),
    "strided": lambda: spconv.SparseConv3d(C, C, 3, 1, 1, bias=False),
    "maxpool": lambda: spconv.SparseMaxPool3d(3, 1, 1),
}


def _run(layer, x):
    """Output, dinput and dW of one layer call."""
    feats = x.features.detach().requires_grad_()
    y = layer(x.replace_feature(feats))
    y.features.backward(torch.ones_like(y.features))
    return [y.features.detach().clone(), feats.grad.clone()] + [p.grad.clone() for p in layer.parameters()]


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_recycled_memory_gives_fresh_results(name):
    torch.manual_seed(0)
    layer, x = LAYERS[name](), _scene()
    output_cache.clear()
    fresh = _run(layer, x)
    layer.zero_grad()
    # Leave garbage in the cached blocks: every output and gradient of the next call lands on a dirty block.
    for _ in range(3):
        with torch.no_grad():
            y = layer(x)
        y.features.fill_(float("nan"))
        del y
    before = output_cache.info()["hits"]
    recycled = _run(layer, x)
    assert output_cache.info()["hits"] > before
    for a, b in zip(fresh, recycled):
        assert torch.equal(a, b)


def test_freed_output_serves_the_next_one():
    layer, x = LAYERS["depthwise"](), _scene()
    output_cache.clear()
    with torch.no_grad():
        y = layer(x).features
        ptr, nbytes = y.data_ptr(), y.nbytes
        del y
        held = output_cache.info()
        assert held["cached_blocks"] == 1 and held["cached_bytes"] >= nbytes
        y = layer(x).features
    assert y.data_ptr() == ptr
    assert output_cache.info()["cached_blocks"] == 0
    output_cache.clear()  # a block under a live tensor stays with it
    assert y.sum().isfinite()


def test_small_outputs_bypass_the_cache():
    layer, x = LAYERS["depthwise"](), _scene(n=400)  # 100 KB outputs, under the cache's 128 KB
    output_cache.clear()
    start = output_cache.info()
    with torch.no_grad():
        layer(x)
    now = output_cache.info()
    assert (now["hits"], now["misses"], now["cached_blocks"]) == (start["hits"], start["misses"], 0)


def test_a_conv_calls_filters_come_from_the_cache():
    # The weight transposed for the call (27 x 64 x 64 floats, 442 KB) is freed when the call ends: the next
    # call takes its block (fresh pages cost a 3-voxel network forward up to half its time).
    layer, x = LAYERS["subm"](), _scene(n=400)
    output_cache.clear()
    with torch.no_grad():
        layer(x)
        first = output_cache.info()
        layer(x)
        second = output_cache.info()
    assert first["cached_blocks"] >= 1
    assert second["hits"] > first["hits"] and second["misses"] == first["misses"]


def test_cached_outputs_are_ordinary_tensors():
    layer, x = LAYERS["depthwise"](), _scene()
    with torch.no_grad():
        y = layer(x).features
    ref = y.clone()
    buf = io.BytesIO()
    torch.save(y, buf)
    buf.seek(0)
    assert torch.equal(torch.load(buf), ref)
    y.resize_(y.shape[0] * 2, C)  # the storage grows through the same allocator
    assert torch.equal(y[:ref.shape[0]], ref)
    y.resize_(10, C)
    assert torch.equal(y, ref[:10])
    z = y.share_memory_()
    assert z.is_shared() and torch.equal(z, ref[:10])


_CAPACITY = r"""
import torch, spconv.pytorch as spconv
from spconv import output_cache
x = torch.randn(25000, 64)  # 6.4 MB outputs
outs = [torch.ops.spconv.grouped_conv(x + i, torch.randn(1, 64, 1, 1), torch.arange(25000, dtype=torch.int32)
        .view(-1, 1), torch.empty(0, 1, dtype=torch.int32)) for i in range(4)]
del outs
print(output_cache.info())
"""


def _capacity_run(value):
    env = dict(os.environ, SPCONV_CPU_OUTPUT_CACHE_MB=value)
    return subprocess.run([sys.executable, "-c", _CAPACITY], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
def test_capacity_bounds_what_is_kept():
    off = eval(_capacity_run("0").stdout)
    assert off["capacity_bytes"] == 0 and off["cached_blocks"] == 0 and off["cached_bytes"] == 0
    small = eval(_capacity_run("16").stdout)  # two of the four 8 MB blocks (6.4 MB in 2 MB steps)
    assert small["capacity_bytes"] == 16 << 20 and small["cached_blocks"] == 2 and small["cached_bytes"] == 16 << 20
    default = eval(_capacity_run("").stdout)
    assert default["capacity_bytes"] == 512 << 20 and default["cached_blocks"] == 4


@pytest.mark.slow
def test_bad_capacity_raises_naming_the_variable():
    r = _capacity_run("lots")
    assert r.returncode != 0 and "SPCONV_CPU_OUTPUT_CACHE_MB must be a non-negative integer" in r.stderr


def test_forked_child_uses_the_cache():
    """A DataLoader worker is a fork: its copy of the cache (and its lock) must work in the child. Like a
    DataLoader worker, the child runs on one thread (OpenMP's pool does not survive a fork)."""
    layer, x = LAYERS["depthwise"](), _scene()
    with torch.no_grad():
        ref = layer(x).features.clone()
        layer(x)  # leaves a freed block in the cache
    pid = os.fork()
    if pid == 0:  # the child: the cached block serves it, and its result is the parent's
        code = 1
        try:
            torch.set_num_threads(1)
            with torch.no_grad():
                hits = output_cache.info()["hits"]
                ok = torch.equal(layer(x).features, ref) and output_cache.info()["hits"] == hits + 1
            code = 0 if ok else 1
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
