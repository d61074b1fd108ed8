"""int8 tensor views: the int8 values of a torch.qint8 tensor and back, sharing memory (no copy). Ground floor:
the int8 layers keep torch's quantized tensors, the ops take plain int8 ones."""
import torch


def int_view(q: torch.Tensor) -> torch.Tensor:
    """The int8 values of a qint8 tensor, sharing its memory."""
    if q.dtype != torch.qint8:
        raise TypeError(f"expected a torch.qint8 tensor, got {q.dtype}")
    if q.qscheme() in (torch.per_tensor_affine, torch.per_tensor_symmetric) and q.q_zero_point() != 0:
        raise ValueError(f"int8 layers need symmetric quantization (zero_point 0), got {q.q_zero_point()}")
    return torch.empty(0, dtype=torch.int8, device=q.device).set_(q.untyped_storage(), q.storage_offset(),
                                                                  q.shape, q.stride())


def as_qint8(t: torch.Tensor, scale: float) -> torch.Tensor:
    """A per-tensor qint8 tensor (zero point 0) over the memory of the int8 tensor ``t``."""
    q = torch._empty_affine_quantized((0,), scale=float(scale), zero_point=0, dtype=torch.qint8, device=t.device)
    return q.set_(t.untyped_storage(), t.storage_offset(), t.shape, t.stride())
