"""``import spconv.pytorch as spconv``: the spconv 2.x PyTorch API."""
from spconv.core import ConvAlgo
from spconv.pytorch import functional, ops
from spconv.pytorch.conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d, SparseConvolution,
                                 SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d,
                                 SparseConvTranspose4d, SparseInverseConv1d, SparseInverseConv2d,
                                 SparseInverseConv3d, SparseInverseConv4d, SubMConv1d, SubMConv2d, SubMConv3d,
                                 SubMConv4d)
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.modules import SparseModule, SparseSequential, is_spconv_module
