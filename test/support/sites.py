"""Random active sites for tests: distinct coordinates in a grid, optionally with repeats, in random order."""
import torch


def random_coords(shape, batch, n, seed):
    """min(n, volume) distinct [batch, *spatial] int32 rows of a batch x shape grid."""
    g = torch.Generator().manual_seed(seed)
    vol = batch
    for s in shape:
        vol *= s
    flat = torch.randperm(vol, generator=g)[:min(n, vol)]
    cols = []
    for s in reversed(shape):
        cols.append(flat % s)
        flat = flat // s
    cols.append(flat)
    return torch.stack(cols[::-1], 1).int()


def coords(shape, batch, n, seed, dups=0):
    """n distinct random sites, the first `dups` of them repeated, in random order."""
    idx = random_coords(shape, batch, n, seed)
    idx = torch.cat([idx, idx[:dups]])
    return idx[torch.randperm(len(idx), generator=torch.Generator().manual_seed(seed + 1))]
