"""``import spconv.pytorch as spconv``: the spconv 2.x PyTorch API."""
# spconv 2.x's __init__ also exposes these module-level imports; kept so every public name resolves.
import platform  # noqa: F401
from pathlib import Path  # noqa: F401
from typing import Union  # noqa: F401

import numpy as np  # noqa: F401
import torch  # noqa: F401

from spconv import constants  # noqa: F401  (spconv 2.x exposes it here too)
from spconv.core import ConvAlgo
from spconv.pytorch import functional, ops
from spconv.pytorch.conv import (SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d, SparseConvolution,
                                 SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d,
                                 SparseConvTranspose4d, SparseInverseConv1d, SparseInverseConv2d,
                                 SparseInverseConv3d, SparseInverseConv4d, SubMConv1d, SubMConv2d, SubMConv3d,
                                 SubMConv4d)
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.identity import Identity
from spconv.pytorch.modules import (RemoveGrid, SparseBatchNorm, SparseIdentity, SparseModule, SparseReLU,
                                    SparseSequential, SparseSyncBatchNorm, ToDense, assign_name_for_sparse_modules,
                                    is_spconv_module)
from spconv.pytorch.pool import (SparseAvgPool1d, SparseAvgPool2d, SparseAvgPool3d, SparseGlobalAvgPool,
                                 SparseGlobalMaxPool, SparseMaxPool1d, SparseMaxPool2d, SparseMaxPool3d,
                                 SparseMaxPool4d)
from spconv.pytorch.tables import AddTable, AddTableMisaligned, ConcatTable, JoinTable, RemoveDuplicate
