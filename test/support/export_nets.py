"""A network with every layer kind that exports (inputs: features and indices, the SparseConvTensor built in
forward), shared by the torch.export and torch.compile tests."""
import torch
from torch import nn

import spconv.pytorch as spconv

SHAPE = [10, 10, 12]
BATCH = 2


class EveryLayer(nn.Module):
    """SubM (shared key, 1x1), regular, transposed and inverse convs (of a conv and of a max pool), max and avg
    pools, SparseSequential with BatchNorm1d/ReLU, SparseBatchNorm/SparseReLU/SparseIdentity, Join/Add/Concat
    tables, RemoveDuplicate, ToDense and dense(), the global pools."""

    def __init__(self):
        super().__init__()
        self.stem = spconv.SparseSequential(spconv.SubMConv3d(3, 8, 3, indice_key="s0"), nn.BatchNorm1d(8),
                                            nn.ReLU())
        self.sub2 = spconv.SubMConv3d(8, 8, 3, indice_key="s0", bias=False)
        self.bn, self.relu = spconv.SparseBatchNorm(8), spconv.SparseReLU()
        self.down = spconv.SparseSequential(spconv.SparseConv3d(8, 8, 3, 2, 1, indice_key="d"), nn.BatchNorm1d(8),
                                            nn.ReLU())
        self.pool = spconv.SparseMaxPool3d(2, 2, indice_key="mp")
        self.unpool = spconv.SparseInverseConv3d(8, 8, 2, indice_key="mp")
        self.avg = spconv.SparseAvgPool3d(3, 1, 1)
        self.up = spconv.SparseInverseConv3d(8, 8, 3, indice_key="d")
        self.trans = spconv.SparseConvTranspose3d(8, 4, 2, 2)
        self.one = spconv.SubMConv3d(8, 8, 1)
        self.join, self.add = spconv.JoinTable(), spconv.AddTable()
        self.branches = spconv.ConcatTable()
        self.branches.add(spconv.SubMConv3d(8, 8, 3, indice_key="s0")).add(spconv.SparseIdentity())
        self.dedup = spconv.RemoveDuplicate()
        self.to_dense = spconv.ToDense()
        self.gmax, self.gavg = spconv.SparseGlobalMaxPool(), spconv.SparseGlobalAvgPool()
        with torch.no_grad():  # non-trivial batch-norm statistics
            for m in self.modules():
                if isinstance(m, nn.BatchNorm1d):
                    m.running_mean.uniform_(-0.2, 0.2)
                    m.running_var.uniform_(0.5, 1.5)

    def forward(self, features, indices):
        x = spconv.SparseConvTensor(features, indices, SHAPE, BATCH)
        x = self.relu(self.bn(self.sub2(self.stem(x))))
        d = self.down(x)
        u = self.unpool(self.pool(d))
        y = self.up(u)
        a = self.avg(u)
        t = self.trans(d)
        b = self.branches(x)
        return (y.features, y.indices, self.join([y, x]).features, self.add([y, x]).features,
                self.one(b[0]).features, b[1].features, self.dedup(x).features, a.features, a.indices,
                t.features, t.indices, self.to_dense(d), a.dense(channels_first=False), self.gmax(d), self.gavg(d))


def inputs(seed, density):
    from support.reference import random_sparse
    x = random_sparse(3, SHAPE, BATCH, 3, density=density, seed=seed)
    return x.features, x.indices
