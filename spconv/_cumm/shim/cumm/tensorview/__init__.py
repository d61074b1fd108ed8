"""``cumm.tensorview`` stand-in: a ``Tensor`` over a numpy array (CPU) or a torch tensor (GPU results of
spconv.utils), ``from_numpy``, ``zeros``/``empty``/``full`` on the CPU, and cumm's dtype codes.

Semantics kept from cumm: ``from_numpy`` shares memory with the array; ``Tensor.numpy()`` returns a copy and
``numpy_view()`` a view; ``shape`` is a list; ``dtype`` is an int code equal to ``tensorview.float32`` etc.;
``device`` is -1 on the CPU, else the GPU index.
"""
from typing import List, Sequence

import numpy as np

from . import gemm  # noqa: F401

SPCONV_CUMM_SHIM = True

# cumm's dtype codes.
float32, int32, int16, int8, float64, bool_, uint8, float16, int64, uint16, uint32, uint64 = range(12)
bfloat16 = 12
tf32 = 13

NPDTYPE_TO_TENSOR_MAP = {np.dtype(np.float32): float32, np.dtype(np.int32): int32, np.dtype(np.int16): int16,
                         np.dtype(np.int8): int8, np.dtype(np.float64): float64, np.dtype(np.bool_): bool_,
                         np.dtype(np.uint8): uint8, np.dtype(np.float16): float16, np.dtype(np.int64): int64,
                         np.dtype(np.uint16): uint16, np.dtype(np.uint32): uint32, np.dtype(np.uint64): uint64}
TENSOR_TO_NPDTYPE_MAP = {v: k for k, v in NPDTYPE_TO_TENSOR_MAP.items()}


def _np_dtype(dtype) -> np.dtype:
    if isinstance(dtype, int) and not isinstance(dtype, bool):
        if dtype not in TENSOR_TO_NPDTYPE_MAP:
            raise ValueError(f"dtype {dtype} has no numpy equivalent here (bfloat16/tf32 are not supported)")
        return TENSOR_TO_NPDTYPE_MAP[dtype]
    return np.dtype(dtype)


class Tensor:
    """A host (numpy) or device (torch) array with cumm ``tv.Tensor``'s read-side interface."""

    def __init__(self, data=None):
        if data is None:
            data = np.zeros((0,), np.float32)
        if not isinstance(data, np.ndarray) and not _is_torch(data):
            raise TypeError(f"Tensor wraps a numpy array or a torch tensor, got {type(data).__name__}")
        self._data = data

    # ---- what callers read ----
    @property
    def shape(self) -> List[int]:
        return [int(s) for s in self._data.shape]

    @property
    def ndim(self) -> int:
        return len(self._data.shape)

    @property
    def dtype(self) -> int:
        return NPDTYPE_TO_TENSOR_MAP[self._host_dtype()]

    @property
    def size(self) -> int:
        return int(np.prod(self._data.shape, dtype=np.int64))

    @property
    def itemsize(self) -> int:
        return self._host_dtype().itemsize

    @property
    def device(self) -> int:
        if isinstance(self._data, np.ndarray) or self._data.device.type == "cpu":
            return -1
        return int(self._data.device.index or 0)

    def dim(self, axis: int) -> int:
        return int(self._data.shape[axis])

    def empty(self) -> bool:
        return self.size == 0

    def is_contiguous(self) -> bool:
        if isinstance(self._data, np.ndarray):
            return bool(self._data.flags["C_CONTIGUOUS"])
        return bool(self._data.is_contiguous())

    def numpy(self) -> np.ndarray:
        """A copy on the host (later changes to either side don't show in the other)."""
        if isinstance(self._data, np.ndarray):
            return self._data.copy()
        return self._data.detach().cpu().numpy().copy()

    def numpy_view(self) -> np.ndarray:
        """The host memory itself (CPU tensors only, as in cumm)."""
        if self.device != -1:
            raise ValueError("numpy_view needs a CPU tensor; use numpy() to copy from the GPU")
        if isinstance(self._data, np.ndarray):
            return self._data
        return self._data.detach().numpy()

    def cpu(self) -> "Tensor":
        return self if self.device == -1 else Tensor(self._data.detach().cpu())

    def clone(self) -> "Tensor":
        return Tensor(self._data.copy() if isinstance(self._data, np.ndarray) else self._data.clone())

    def __repr__(self) -> str:
        return f"tensorview.Tensor(shape={self.shape}, dtype={self._host_dtype()}, device={self.device})"

    def _host_dtype(self) -> np.dtype:
        if isinstance(self._data, np.ndarray):
            return self._data.dtype
        import torch  # only reached for torch-backed tensors
        return np.dtype(torch.empty((), dtype=self._data.dtype).numpy().dtype)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch") and hasattr(x, "device") and hasattr(x, "is_contiguous")


def from_numpy(arr: np.ndarray) -> Tensor:
    """A Tensor sharing ``arr``'s memory (like cumm, the array must be a numpy array)."""
    if not isinstance(arr, np.ndarray):
        raise TypeError(f"from_numpy: arr must be a numpy.ndarray, got {type(arr).__name__}")
    if arr.dtype not in NPDTYPE_TO_TENSOR_MAP:
        raise TypeError(f"from_numpy: arr has dtype {arr.dtype}, which cumm's tensorview has no code for")
    return Tensor(arr)


def _host_only(device: int, fn: str) -> None:
    if device != -1:
        raise ValueError(f"{fn}: this cumm stand-in makes CPU tensors only (device=-1), got device={device}")


def zeros(shape: Sequence[int], dtype: int = float32, device: int = -1) -> Tensor:
    _host_only(device, "zeros")
    return Tensor(np.zeros(list(shape), _np_dtype(dtype)))


def empty(shape: Sequence[int], dtype: int = float32, device: int = -1) -> Tensor:
    _host_only(device, "empty")
    return Tensor(np.empty(list(shape), _np_dtype(dtype)))


def full(shape: Sequence[int], val, dtype: int = float32, device: int = -1) -> Tensor:
    _host_only(device, "full")
    return Tensor(np.full(list(shape), val, _np_dtype(dtype)))
