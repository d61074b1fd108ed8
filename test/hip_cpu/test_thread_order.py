"""The two thread orders of the HIP CPU build (csrc/hip/hip_cpu_thread_order.h): in descending order the highest
logical thread of a one-dimensional block of whole wavefronts runs first, its logical ids are a permutation of its
ids, a shuffle-down reduction gives every lane the same value as in ascending order, and other blocks (partial
wavefronts, several dimensions) keep the runtime's order."""
import numpy as np
import pytest

from conftest import hip_cpu_program, run_program

pytestmark = pytest.mark.hip_cpu
WAVE = 64


@pytest.fixture(scope="module")
def exe():
    return hip_cpu_program("thread_order_test", ["test/hip_cpu/thread_order_test.cu"])


def run(exe, tmp_path, order, block):
    out = tmp_path / ("%s-%d-%d-%d.bin" % ((order,) + block))
    run_program(exe, order, *block, out)
    return np.fromfile(out, np.int32).reshape(-1, 6)


def expected_warp_sums(n):
    """warp_sum(id + 1) as a shuffle-down tree leaves it: lane l holds the sum over lanes l, l+1, ... reached by
    the tree (lane 0 the whole wavefront's)."""
    ids = np.arange(n) + 1
    sums = []
    for w in range(0, n, WAVE):
        v = ids[w:w + WAVE].astype(np.int64).copy()
        width = len(v)
        d = WAVE // 2
        while d > 0:
            src = np.arange(width) + d
            v = v + np.where(src < width, v[np.minimum(src, width - 1)], v)  # out of range: the lane's own value
            d //= 2
        sums.extend(v.tolist())
    return np.array(sums)


@pytest.mark.parametrize("block", [(256, 1, 1), (64, 1, 1), (128, 1, 1)])
def test_descending_runs_the_highest_logical_thread_first(exe, tmp_path, block):
    n = int(np.prod(block))
    up, down = run(exe, tmp_path, "ascending", block), run(exe, tmp_path, "descending", block)
    for r in (up, down):
        assert (r[:, 5] == 1).all()  # every logical id written once: a permutation
        lin = r[:, 1] + block[0] * (r[:, 2] + block[1] * r[:, 3])
        assert (lin == np.arange(n)).all()  # threadIdx decomposes as the block's shape says
    assert (up[:, 0] == np.arange(n)).all()
    assert (down[:, 0] == np.arange(n)[::-1]).all()
    assert (up[:, 4] == expected_warp_sums(n)).all()
    assert (down[:, 4] == up[:, 4]).all()  # warp operations follow the logical lanes


@pytest.mark.parametrize("block", [(1, 1, 1), (32, 1, 1), (96, 1, 1), (32, 4, 2), (64, 2, 1)])
def test_other_blocks_keep_the_runtime_order(exe, tmp_path, block):
    up, down = run(exe, tmp_path, "ascending", block), run(exe, tmp_path, "descending", block)
    assert (down == up).all()
    assert (up[:, 5] == 1).all()
