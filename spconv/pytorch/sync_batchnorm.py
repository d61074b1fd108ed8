"""Cross-process batch norm for ``SparseSyncBatchNorm`` that runs on any device and backend (gloo on CPU,
nccl/rccl on GPU).

torch's ``nn.SyncBatchNorm`` only runs on GPU (and DistributedDataParallel refuses it in CPU modules), so the
statistics are reduced here with plain ``all_reduce`` calls: one in forward (per-channel sum, sum of squares and
row count) and one in backward (the two per-channel gradient sums). Every rank joins both, including ranks with
no rows at all (an empty sparse tensor), which contribute zeros.
"""
from typing import Optional

import torch
import torch.distributed as dist
from torch.autograd.function import once_differentiable


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    # Local statistics in at least float32; the cross-rank combination in float64 (no cancellation trouble).
    return torch.float64 if dtype == torch.float64 else torch.float32


class SyncBatchNormFunction(torch.autograd.Function):
    """Batch norm over the rows of ``x`` ([N, C]) of every rank in ``process_group`` (training mode)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: Optional[torch.Tensor], bias: Optional[torch.Tensor],
                running_mean: Optional[torch.Tensor], running_var: Optional[torch.Tensor], eps: float,
                momentum: float, process_group):
        c = x.shape[1]
        sdt = _stat_dtype(x.dtype)
        xs = x.to(sdt)
        n_local = x.shape[0]
        if n_local > 0:
            var_l, mean_l = torch.var_mean(xs, dim=0, correction=0)  # stable local moments
            mean_l, var_l = mean_l.double(), var_l.double()
            stats = torch.cat([mean_l * n_local, (var_l + mean_l * mean_l) * n_local,
                               mean_l.new_full((1,), float(n_local))])
        else:
            stats = torch.zeros(2 * c + 1, dtype=torch.float64, device=x.device)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM, group=process_group)
        count = stats[2 * c].item()
        if count < 1:
            raise ValueError("SparseSyncBatchNorm: no rows on any rank (empty batch)")
        if count == 1:
            raise ValueError("Expected more than 1 value per channel when training, got 1 row on all ranks")
        mean = stats[:c] / count
        var = (stats[c:2 * c] / count - mean * mean).clamp_min(0.0)
        invstd = torch.rsqrt(var + eps)

        if running_mean is not None:
            with torch.no_grad():
                running_mean.mul_(1.0 - momentum).add_(mean.to(running_mean.dtype), alpha=momentum)
                running_var.mul_(1.0 - momentum).add_((var * (count / (count - 1))).to(running_var.dtype),
                                                      alpha=momentum)

        mean_s, invstd_s = mean.to(sdt), invstd.to(sdt)
        y = (xs - mean_s) * invstd_s
        if weight is not None:
            y = y * weight.to(sdt)
        if bias is not None:
            y = y + bias.to(sdt)
        ctx.save_for_backward(x, weight, mean_s, invstd_s)
        ctx.count = count
        ctx.process_group = process_group
        ctx.has_bias = bias is not None
        return y.to(x.dtype)

    @staticmethod
    @once_differentiable
    def backward(ctx, dy: torch.Tensor):
        x, weight, mean, invstd = ctx.saved_tensors
        sdt = mean.dtype
        dys = dy.to(sdt)
        xmu = x.to(sdt) - mean
        sum_dy = dys.sum(0)
        sum_dy_xmu = (dys * xmu).sum(0)
        grad_x = grad_w = grad_b = None
        if weight is not None and ctx.needs_input_grad[1]:
            grad_w = (sum_dy_xmu * invstd).to(weight.dtype)  # local: DDP averages parameter gradients
        if ctx.has_bias and ctx.needs_input_grad[2]:
            grad_b = sum_dy.to(dy.dtype)
        if ctx.needs_input_grad[0]:
            c = x.shape[1]
            sums = torch.cat([sum_dy, sum_dy_xmu])
            dist.all_reduce(sums, op=dist.ReduceOp.SUM, group=ctx.process_group)
            mean_dy = sums[:c] / ctx.count
            mean_dy_xmu = sums[c:] / ctx.count
            scale = invstd if weight is None else invstd * weight.to(sdt)
            grad_x = ((dys - mean_dy - xmu * (invstd * invstd * mean_dy_xmu)) * scale).to(x.dtype)
        return grad_x, grad_w, grad_b, None, None, None, None, None


def sync_batch_norm(x: torch.Tensor, weight, bias, running_mean, running_var, eps: float, momentum: float,
                    process_group) -> torch.Tensor:
    """``x`` is [N, C, *]; statistics per channel over every other dim and over all ranks of the group."""
    if x.dim() == 2:
        return SyncBatchNormFunction.apply(x, weight, bias, running_mean, running_var, eps, momentum,
                                           process_group)
    moved = x.movedim(1, -1)
    flat = SyncBatchNormFunction.apply(moved.reshape(-1, x.shape[1]), weight, bias, running_mean, running_var,
                                       eps, momentum, process_group)
    return flat.reshape(moved.shape).movedim(-1, 1)
