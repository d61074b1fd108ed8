"""The CPU kernel maps' exact layout, against a direct Python construction.

Layout: pairs grouped by kernel offset (last dimension fastest), rows ascending within a group; regular
and transposed maps number their outputs in first-seen order, visiting the inputs by packed key (ties by
row) and each input's offsets ascending. The builders sort and merge rather than hash; this pins that down.
"""
import itertools

import pytest
import torch

import spconv.pytorch  # noqa: F401  (registers the ops)


def pack(b, c, shape):
    key = b
    for v, s in zip(c, shape):
        key = key * s + v
    return key


def reference_map(ind, shape, out_shape, ksize, stride, padding, dilation, subm, transpose):
    rows = [tuple(r) for r in ind.tolist()]
    nd = len(shape)
    offsets = list(itertools.product(*[range(k) for k in ksize]))
    pairs = [[] for _ in offsets]
    if subm:
        where = {r: i for i, r in enumerate(rows)}
        for i, r in enumerate(rows):
            for k, o in enumerate(offsets):
                c = tuple(r[1 + d] + (o[d] - ksize[d] // 2) * dilation[d] for d in range(nd))
                if all(0 <= c[d] < shape[d] for d in range(nd)) and (r[0],) + c in where:
                    pairs[k].append((where[(r[0],) + c], i))
        out = ind.clone()
    else:
        ids, out_rows, table = {}, [], {}
        order = sorted(range(len(rows)), key=lambda i: (pack(rows[i][0], rows[i][1:], shape), i))
        for i in order:
            r = rows[i]
            for k, o in enumerate(offsets):
                c = []
                for d in range(nd):
                    if transpose:
                        v = r[1 + d] * stride[d] - padding[d] + o[d] * dilation[d]
                    else:
                        num = r[1 + d] + padding[d] - o[d] * dilation[d]
                        v = num // stride[d] if num >= 0 and num % stride[d] == 0 else -1
                    c.append(v)
                if all(0 <= c[d] < out_shape[d] for d in range(nd)):
                    key = (r[0],) + tuple(c)
                    if key not in ids:
                        ids[key] = len(out_rows)
                        out_rows.append(key)
                    table[(i, k)] = ids[key]
        for (i, k), o in sorted(table.items()):
            pairs[k].append((i, o))
        out = torch.tensor(out_rows, dtype=torch.int32).reshape(-1, nd + 1)
    flat = [p for group in pairs for p in group]
    pin = torch.tensor([p[0] for p in flat], dtype=torch.int32)
    pout = torch.tensor([p[1] for p in flat], dtype=torch.int32)
    offs = torch.tensor([0] + list(itertools.accumulate(len(g) for g in pairs)), dtype=torch.int64)
    return out, pin, pout, offs


def random_sites(n, shape, batch, seed):
    g = torch.Generator().manual_seed(seed)
    cols = [torch.randint(0, batch, (n,), generator=g)] + [torch.randint(0, s, (n,), generator=g) for s in shape]
    sites = torch.unique(torch.stack(cols, 1).int(), dim=0)
    return sites[torch.randperm(sites.shape[0], generator=g)].contiguous()


CASES = [
    # shape, ksize, stride, padding, dilation, subm, transpose
    ([9, 8, 7], [3, 3, 3], [1, 1, 1], [1, 1, 1], [1, 1, 1], True, False),
    ([9, 8, 7], [3, 1, 3], [1, 1, 1], [0, 0, 0], [2, 1, 2], True, False),
    ([9, 8, 7], [2, 2, 2], [1, 1, 1], [0, 0, 0], [1, 1, 1], True, False),
    ([9, 8, 7], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, False),
    ([9, 8, 7], [3, 3, 3], [2, 2, 2], [1, 1, 1], [1, 1, 1], False, False),
    ([9, 8, 7], [3, 2, 3], [3, 2, 1], [0, 1, 1], [1, 1, 2], False, False),
    ([9, 8, 7], [2, 2, 2], [2, 2, 2], [0, 0, 0], [1, 1, 1], False, True),
    ([30], [5], [1], [2], [1], True, False),
    ([12, 11], [3, 3], [2, 2], [1, 1], [1, 1], False, False),
    ([5, 4, 4, 3], [3, 3, 3, 3], [1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 1, 1], True, False),
]


def out_shape_of(shape, ksize, stride, padding, dilation, subm, transpose):
    if subm:
        return shape
    if transpose:
        return [(i - 1) * s - 2 * p + d * (k - 1) + 1 for i, k, s, p, d in zip(shape, ksize, stride, padding, dilation)]
    return [(i + 2 * p - d * (k - 1) - 1) // s + 1 for i, k, s, p, d in zip(shape, ksize, stride, padding, dilation)]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("case", range(len(CASES)))
def test_kernel_map_layout_matches_reference(case, threads):
    shape, ksize, stride, padding, dilation, subm, transpose = CASES[case]
    osh = out_shape_of(shape, ksize, stride, padding, dilation, subm, transpose)
    ind = random_sites(150, shape, 2, case)
    prev = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        got = torch.ops.spconv.get_indice_pairs(ind, 2, shape, osh, ksize, stride, padding, dilation, subm, transpose)
    finally:
        torch.set_num_threads(prev)
    want = reference_map(ind, shape, osh, ksize, stride, padding, dilation, subm, transpose)
    for g, w in zip(got, want):
        assert torch.equal(g, w)


def test_subm_reports_first_repeating_row():
    ind = random_sites(300, [10, 10, 10], 1, 3)
    ind[200] = ind[17]
    ind[150] = ind[250]
    with pytest.raises(ValueError, match="row 200 repeats"):
        torch.ops.spconv.get_indice_pairs(ind, 1, [10] * 3, [10] * 3, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False)


# Maps large enough for every parallel pass of the builders: SubM and candidate passes over many row blocks,
# the radix sort's parallel passes, several chunks of the output numbering, the parallel table fill.
LARGE = [
    ([3, 3, 3], [1, 1, 1], [1, 1, 1], True, False),
    ([2, 2, 2], [2, 2, 2], [0, 0, 0], False, False),
    ([3, 3, 3], [2, 2, 2], [1, 1, 1], False, False),
    ([3, 3, 3], [2, 2, 2], [1, 1, 1], False, True),
]


@pytest.fixture(scope="module")
def large_sites():
    return random_sites(150_000, [96, 96, 48], 2, 7)


@pytest.mark.slow
@pytest.mark.parametrize("case", range(len(LARGE)))
def test_large_kernel_maps_same_for_any_thread_count(case, large_sites):
    ksize, stride, padding, subm, transpose = LARGE[case]
    shape = [96, 96, 48]
    osh = out_shape_of(shape, ksize, stride, padding, [1, 1, 1], subm, transpose)
    args = (large_sites, 2, shape, osh, ksize, stride, padding, [1, 1, 1], subm, transpose)
    prev = torch.get_num_threads()
    try:
        maps = {}
        for threads in (1, 2, 3, 8):  # more threads than cores split the work finer still
            torch.set_num_threads(threads)
            maps[threads] = torch.ops.spconv.get_indice_pairs(*args)
    finally:
        torch.set_num_threads(prev)
    assert maps[1][1].numel() > 3 * 4096 * 8  # the passes above their serial thresholds
    for threads, got in maps.items():
        for g, w in zip(got, maps[1]):
            assert torch.equal(g, w), f"{threads} threads"
    if case == 1:  # the pooling map, against the direct construction (a few seconds of Python)
        want = reference_map(large_sites, shape, osh, ksize, stride, padding, [1, 1, 1], subm, transpose)
        for g, w in zip(maps[2], want):
            assert torch.equal(g, w)
