"""Key -> value hash table on CPU and GPU (spconv 2.x: ``spconv.pytorch.hash``)."""
from typing import Optional

import torch

from spconv import _backend  # loads the extension; _backend.ops is the op library the wrappers call

_ops = _backend.ops  # the selected op library (torch.ops.spconv unless a test swaps it)

_KEY_DTYPES = (torch.int32, torch.int64)
_VALUE_DTYPES = (torch.int32, torch.int64, torch.float32, torch.float64)


def _empty_key(dtype: torch.dtype) -> int:
    return torch.iinfo(dtype).max


class HashTable:
    """Hash table of int32/int64 keys and 32/64-bit values, on the CPU or a GPU.

    Same interface as spconv 2.x. On the GPU the table has a fixed ``max_size`` slots (spconv recommends twice
    the number of keys); on the CPU it grows as needed and ``max_size`` is only a starting size.
    Both keep the keys in two flat tensors (``keys_data``, ``values_data``) with open addressing; a slot is
    empty when its key is the largest value of the key dtype, so that key cannot be inserted (ValueError).

    Semantics, identical on CPU and GPU and deterministic (spconv's differ between its CPU and GPU builds):

    * ``insert``: a key already present keeps its value; a key repeated within one call gets the value of its
      first occurrence; ``values=None`` stores 0.
    * ``query``: absent keys get 0 (or keep the entry of the ``values`` tensor you pass) and ``is_empty`` 1.
    * ``insert_exist_keys``: overwrites present keys (first occurrence wins), never adds keys.
    * ``items`` and ``assign_arange_`` go through the slots in order. ``items`` returns exactly ``count`` keys
      and values (spconv's GPU build returns ``max_size`` entries of which the first ``count`` are valid, so
      ``keys[:count]`` works with both).
    """

    def __init__(self, device: torch.device, key_dtype: torch.dtype, value_dtype: torch.dtype,
                 max_size: int = -1) -> None:
        device = torch.device(device)
        if key_dtype not in _KEY_DTYPES:
            raise TypeError(f"key_dtype must be torch.int32 or torch.int64, got {key_dtype}")
        if value_dtype not in _VALUE_DTYPES:
            raise TypeError(f"value_dtype must be int32, int64, float32 or float64, got {value_dtype}")
        self.is_cpu = device.type == "cpu"
        if not self.is_cpu and int(max_size) <= 0:
            raise ValueError("max_size must be given (> 0) for a GPU hash table; twice the number of keys is usual")
        self.key_dtype = key_dtype
        self.value_dtype = value_dtype
        self.key_itemsize = torch.empty((), dtype=key_dtype).element_size()
        self.value_itemsize = torch.empty((), dtype=value_dtype).element_size()
        self.device = device
        self._empty = _empty_key(key_dtype)
        self._insert_count = 0  # keys passed to insert so far: bounds the number of used slots
        capacity = int(max_size) if not self.is_cpu else max(16, 2 * int(max_size))
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        self.keys_data = torch.full([capacity], self._empty, dtype=self.key_dtype, device=self.device)
        self.values_data = torch.zeros([capacity], dtype=self.value_dtype, device=self.device)

    def _check_keys(self, keys: torch.Tensor, name: str = "keys") -> None:
        if not isinstance(keys, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(keys).__name__}")
        if keys.device.type != self.device.type:
            raise ValueError(f"{name} are on {keys.device} but the table on {self.device}")

    def _reserve_cpu(self, extra: int) -> None:
        """Keeps the CPU table at most half full, rehashing into a larger one when needed."""
        used = int((self.keys_data != self._empty).sum())
        if 2 * (used + extra) <= self.keys_data.shape[0]:
            return
        capacity = self.keys_data.shape[0]
        while 2 * (used + extra) > capacity:
            capacity *= 2
        old_keys, old_values = self.items()[:2]
        self._allocate(capacity)
        _ops.hash_table_insert(self.keys_data, self.values_data, old_keys, old_values)

    def insert(self, keys: torch.Tensor, values: Optional[torch.Tensor] = None):
        """Inserts ``keys`` (1-D) with ``values`` (1-D, same length), or with 0 when ``values`` is None."""
        self._check_keys(keys)
        n = keys.shape[0] if keys.dim() == 1 else -1
        if self.is_cpu:
            self._reserve_cpu(max(n, 0))
        elif self._insert_count + max(n, 0) >= self.keys_data.shape[0]:
            raise ValueError(f"GPU hash table of max_size={self.keys_data.shape[0]} cannot take {n} more keys "
                             f"after {self._insert_count} inserted; create it with a larger max_size")
        _ops.hash_table_insert(self.keys_data, self.values_data, keys, values)
        self._insert_count += max(n, 0)

    def query(self, keys: torch.Tensor, values: Optional[torch.Tensor] = None):
        """``(values, is_empty)``: the value of every key and a uint8 flag set where the key is absent.

        When ``values`` is given it is filled in place (absent keys leave their entry untouched) and returned.
        """
        self._check_keys(keys)
        out, is_empty = _ops.hash_table_query(self.keys_data, self.values_data, keys)
        if values is None:
            return out, is_empty
        if not isinstance(values, torch.Tensor) or values.shape != out.shape or values.dtype != out.dtype:
            raise ValueError(f"values must be a {out.dtype} tensor of shape {list(out.shape)}")
        values.copy_(torch.where(is_empty.bool(), values, out))
        return values, is_empty

    def insert_exist_keys(self, keys: torch.Tensor, values: torch.Tensor):
        """Sets the value of keys already in the table; returns the uint8 is_empty flags of the others."""
        self._check_keys(keys)
        return _ops.hash_table_insert_exist_keys(self.keys_data, self.values_data, keys, values)

    def _count_tensor(self, count: int) -> torch.Tensor:
        # spconv: int64 on the CPU; on the GPU the key width (int32 or int64).
        dtype = torch.int64 if self.is_cpu else self.key_dtype
        return torch.tensor([count], dtype=dtype, device=self.device)

    def assign_arange_(self):
        """Sets the values to 0, 1, 2, ... in slot order; returns the number of keys (a 1-element tensor)."""
        if self.value_dtype not in (torch.int32, torch.int64):
            raise TypeError(f"assign_arange_ needs an int32 or int64 value dtype, got {self.value_dtype}")
        used = self.keys_data != self._empty
        count = int(used.sum())
        self.values_data[used] = torch.arange(count, dtype=self.value_dtype, device=self.device)
        return self._count_tensor(count)

    def items(self, max_size: int = -1):
        """``(keys, values, count)`` of every stored key in slot order (at most ``max_size`` when given)."""
        used = torch.nonzero(self.keys_data != self._empty).view(-1)
        if max_size >= 0:
            used = used[:max_size]
        return self.keys_data[used], self.values_data[used], self._count_tensor(used.shape[0])


@torch.library.register_fake("spconv::hash_table_insert")
def _hash_table_insert_fake(table_keys, table_values, keys, values):
    return None


@torch.library.register_fake("spconv::hash_table_query")
def _hash_table_query_fake(table_keys, table_values, keys):
    return table_values.new_empty(keys.shape), keys.new_empty(keys.shape, dtype=torch.uint8)


@torch.library.register_fake("spconv::hash_table_insert_exist_keys")
def _hash_table_insert_exist_keys_fake(table_keys, table_values, keys, values):
    return keys.new_empty(keys.shape, dtype=torch.uint8)
