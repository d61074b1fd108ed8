"""fused_conv checks its tables on both devices: nbr entries index the features, order is a permutation."""
import pytest
import torch

import spconv._backend  # noqa: F401



def tables(op, n_out=70, n_in=50, kvol=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    nbr = torch.randint(-1, n_in, (n_out, kvol), generator=g, dtype=torch.int32)
    masks = torch.zeros(1, n_out, dtype=torch.int32)
    for k in range(kvol):
        masks[0] |= (nbr[:, k] >= 0).int() << k
    order = torch.argsort(masks[0].long(), stable=True).int()[None]
    x = torch.randn(n_in, 3, generator=g)
    w = torch.randn(kvol, 3, 5, generator=g)
    return x, w, nbr, masks, order


def check_rejects(op):
    x, w, nbr, masks, order = tables(op)
    bad = nbr.clone()
    bad[3, 1] = x.shape[0]  # one past the features' rows
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        op.fused_conv(x, w, bad, masks, order)
    bad = nbr.clone()
    bad[5, 0] = -2
    with pytest.raises(ValueError, match="nbr holds rows outside"):
        op.fused_conv(x, w, bad, masks, order)
    twice = order.clone()
    twice[0, 1] = twice[0, 0]  # one row taken twice, another never
    with pytest.raises(ValueError, match="permutation"):
        op.fused_conv(x, w, nbr, masks, twice)
    far = order.clone()
    far[0, 2] = nbr.shape[0]
    with pytest.raises(ValueError, match="permutation"):
        op.fused_conv(x, w, nbr, masks, far)
    op.fused_conv(x, w, nbr, masks, order)  # the good tables pass


def test_cpu_reference_checks_tables():
    """Before: the CPU reference checked nbr's upper bound only, and never order."""
    check_rejects(torch.ops.spconv)


@pytest.mark.hip_cpu
def test_gpu_glue_checks_tables(hip_cpu):
    """Before: the GPU glue checked neither (out-of-bounds reads and writes)."""
    check_rejects(hip_cpu)
