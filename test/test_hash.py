"""spconv.pytorch.hash.HashTable on CPU (and GPU when present): round trips, missing keys, semantics."""
import pytest
import torch

import spconv._backend as backend
from spconv.pytorch.hash import HashTable

GPU = torch.cuda.is_available() and backend.has_gpu_kernels()
DEVICES = ["cpu"] + (["cuda"] if GPU else [])
needs_gpu = pytest.mark.gpu  # skipped without a GPU (conftest)


def make_table(device, kd, vd, n):
    return HashTable(torch.device(device), kd, vd, max_size=-1 if device == "cpu" else 2 * n + 16)


def unique_keys(n, kd, device, seed=0):
    g = torch.Generator().manual_seed(seed)
    hi = 2**31 - 2 if kd == torch.int32 else 2**62
    keys = torch.unique(torch.randint(-hi, hi, (2 * n,), generator=g, dtype=torch.int64))
    keys = keys[torch.randperm(keys.shape[0], generator=g)][:n]
    return keys.to(kd).to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kd", [torch.int32, torch.int64])
@pytest.mark.parametrize("vd", [torch.int32, torch.int64, torch.float32, torch.float64])
def test_round_trip_and_missing_keys(device, kd, vd):
    n = 3000
    keys = unique_keys(n, kd, device)
    values = (torch.arange(n, device=device) * 3 - 7).to(vd)
    table = make_table(device, kd, vd, n)
    table.insert(keys, values)
    got, is_empty = table.query(keys)
    assert got.dtype == vd and is_empty.dtype == torch.uint8
    assert torch.equal(got, values) and not bool(is_empty.any())
    # Keys that were never inserted.
    missing = unique_keys(500, kd, device, seed=1)
    missing = missing[~torch.isin(missing, keys)]
    got, is_empty = table.query(missing)
    assert bool(is_empty.all()) and bool((got == 0).all())
    # A caller-provided values tensor keeps its entries for missing keys.
    mixed = torch.cat([keys[:5], missing[:5]])
    out = torch.full((10,), 42, dtype=vd, device=device)
    res, is_empty = table.query(mixed, out)
    assert res is out and is_empty.tolist() == [0] * 5 + [1] * 5
    assert torch.equal(out[:5], values[:5]) and bool((out[5:] == 42).all())
    # items: every key once with its value.
    k, v, count = table.items()
    assert int(count.item()) == n and k.shape[0] == n
    order = torch.argsort(k)
    ref = torch.argsort(keys)
    assert torch.equal(k[order], keys[ref]) and torch.equal(v[order], values[ref])


@pytest.mark.parametrize("device", DEVICES)
def test_insert_semantics_first_occurrence_and_present_keys(device):
    table = make_table(device, torch.int64, torch.int64, 64)
    table.insert(torch.tensor([5, 3, 5, 9], device=device), torch.tensor([1, 2, 3, 4], device=device))
    table.insert(torch.tensor([3, 11], device=device), torch.tensor([100, 200], device=device))
    got, _ = table.query(torch.tensor([5, 3, 9, 11], device=device))
    assert got.tolist() == [1, 2, 4, 200]  # first occurrence wins; present keys keep their value
    table.insert(torch.tensor([12, 13], device=device))  # values=None -> 0
    assert table.query(torch.tensor([12, 13], device=device))[0].tolist() == [0, 0]


@pytest.mark.parametrize("device", DEVICES)
def test_insert_exist_keys(device):
    table = make_table(device, torch.int32, torch.float32, 32)
    table.insert(torch.tensor([1, 2, 3], dtype=torch.int32, device=device),
                 torch.tensor([1.0, 2.0, 3.0], device=device))
    is_empty = table.insert_exist_keys(torch.tensor([2, 7, 2, 3], dtype=torch.int32, device=device),
                                       torch.tensor([20.0, 70.0, 21.0, 30.0], device=device))
    assert is_empty.tolist() == [0, 1, 0, 0]
    got, empty = table.query(torch.tensor([1, 2, 3, 7], dtype=torch.int32, device=device))
    assert got.tolist() == [1.0, 20.0, 30.0, 0.0] and empty.tolist() == [0, 0, 0, 1]  # 7 was not added


@pytest.mark.parametrize("device", DEVICES)
def test_assign_arange_and_items(device):
    n = 200
    keys = unique_keys(n, torch.int64, device, seed=4)
    table = make_table(device, torch.int64, torch.int32, n)
    table.insert(keys)
    count = table.assign_arange_()
    assert int(count.item()) == n
    k, v, count = table.items()
    assert sorted(v.tolist()) == list(range(n))
    got, _ = table.query(k)
    assert torch.equal(got, v)  # items and the table agree
    k2, v2, c2 = table.items(max_size=10)
    assert k2.shape[0] == 10 and int(c2.item()) == 10 and torch.equal(k2, k[:10])


def test_cpu_table_grows_and_is_deterministic():
    tables = []
    for _ in range(2):
        table = HashTable(torch.device("cpu"), torch.int64, torch.int64)
        for chunk in range(10):  # many inserts past the initial 16 slots
            ks = torch.arange(chunk * 1000, chunk * 1000 + 1000) * 7919
            table.insert(ks, ks + 1)
        tables.append(table)
    ks = torch.arange(10000) * 7919
    got, is_empty = tables[0].query(ks)
    assert torch.equal(got, ks + 1) and not bool(is_empty.any())
    a, b = tables[0].items(), tables[1].items()
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


@pytest.mark.parametrize("device", DEVICES)
def test_empty_keys(device):
    table = make_table(device, torch.int32, torch.int64, 8)
    empty = torch.zeros(0, dtype=torch.int32, device=device)
    table.insert(empty, torch.zeros(0, dtype=torch.int64, device=device))
    v, e = table.query(empty)
    assert v.shape == (0,) and e.shape == (0,)
    k, v, count = table.items()
    assert k.shape == (0,) and int(count.item()) == 0
    assert table.insert_exist_keys(empty, torch.zeros(0, dtype=torch.int64, device=device)).shape == (0,)


def test_bad_arguments_raise():
    table = HashTable(torch.device("cpu"), torch.int32, torch.int64)
    with pytest.raises(TypeError, match="keys must have the table's key dtype"):
        table.insert(torch.tensor([1, 2], dtype=torch.int64))
    with pytest.raises(TypeError, match="values must have the table's value dtype"):
        table.insert(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="values must be 1-D with 2 entries"):
        table.insert(torch.tensor([1, 2], dtype=torch.int32), torch.tensor([1], dtype=torch.int64))
    with pytest.raises(ValueError, match="reserved to mark empty slots"):
        table.insert(torch.tensor([2**31 - 1], dtype=torch.int32))
    with pytest.raises(ValueError, match="keys must be 1-D"):
        table.query(torch.zeros(2, 2, dtype=torch.int32))
    with pytest.raises(TypeError, match="key_dtype"):
        HashTable(torch.device("cpu"), torch.float32, torch.int64)
    with pytest.raises(TypeError, match="value_dtype"):
        HashTable(torch.device("cpu"), torch.int32, torch.int16)
    with pytest.raises(TypeError, match="assign_arange_"):
        HashTable(torch.device("cpu"), torch.int32, torch.float32).assign_arange_()
    with pytest.raises(ValueError, match="max_size"):
        HashTable(torch.device("cuda"), torch.int32, torch.int32)
    # The op names its argument too: a full table.
    tk = torch.full((2,), 2**31 - 1, dtype=torch.int32)
    tv = torch.zeros(2, dtype=torch.int32)
    with pytest.raises(ValueError, match="hash table is full"):
        torch.ops.spconv.hash_table_insert(tk, tv, torch.tensor([1, 2, 3], dtype=torch.int32), None)


def test_opcheck_hash_ops():
    for kd, vd in [(torch.int32, torch.float32), (torch.int64, torch.int64)]:
        empty = torch.iinfo(kd).max
        tk = torch.full((64,), empty, dtype=kd)
        tv = torch.zeros(64, dtype=vd)
        keys = torch.tensor([4, -9, 17, 4, 100], dtype=kd)
        values = torch.arange(5).to(vd)
        torch.library.opcheck(torch.ops.spconv.hash_table_insert.default, (tk.clone(), tv.clone(), keys, values))
        torch.library.opcheck(torch.ops.spconv.hash_table_insert.default, (tk.clone(), tv.clone(), keys, None))
        torch.ops.spconv.hash_table_insert(tk, tv, keys, values)
        torch.library.opcheck(torch.ops.spconv.hash_table_query.default, (tk, tv, keys))
        torch.library.opcheck(torch.ops.spconv.hash_table_insert_exist_keys.default,
                              (tk, tv.clone(), keys[:3], values[:3]))


@needs_gpu
def test_gpu_table_capacity_and_opcheck():
    table = HashTable(torch.device("cuda"), torch.int64, torch.float64, max_size=10)
    table.insert(torch.arange(6, device="cuda"), torch.arange(6, device="cuda").double())
    with pytest.raises(ValueError, match="max_size"):
        table.insert(torch.arange(6, 12, device="cuda"))
    tk = torch.full((64,), 2**63 - 1, dtype=torch.int64, device="cuda")
    tv = torch.zeros(64, dtype=torch.float32, device="cuda")
    keys = torch.tensor([4, -9, 17, 4], device="cuda")
    torch.library.opcheck(torch.ops.spconv.hash_table_insert.default,
                          (tk.clone(), tv.clone(), keys, torch.ones(4, device="cuda")))
    torch.ops.spconv.hash_table_insert(tk, tv, keys, torch.arange(4, device="cuda").float())
    torch.library.opcheck(torch.ops.spconv.hash_table_query.default, (tk, tv, keys))
