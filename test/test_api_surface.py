"""Every public name of spconv 2.3.8's ``spconv.pytorch`` (and of the submodules models import from) resolves,
with spconv's constructor signatures for the layers models build."""
import importlib
import inspect

import pytest

import spconv.pytorch as spconv

# The module-level public names of spconv 2.3.8's spconv/pytorch/__init__.py (its imports and classes).
SPCONV_PYTORCH_NAMES = [
    "platform", "Path", "Union", "np", "torch",
    "SparseConvTensor", "functional", "ops",
    "SparseConv1d", "SparseConv2d", "SparseConv3d", "SparseConv4d",
    "SparseConvTranspose1d", "SparseConvTranspose2d", "SparseConvTranspose3d", "SparseConvTranspose4d",
    "SparseInverseConv1d", "SparseInverseConv2d", "SparseInverseConv3d", "SparseInverseConv4d",
    "SubMConv1d", "SubMConv2d", "SubMConv3d", "SubMConv4d",
    "Identity",
    "SparseModule", "SparseSequential", "assign_name_for_sparse_modules", "SparseBatchNorm", "SparseReLU",
    "SparseIdentity",
    "ConvAlgo",
    "SparseMaxPool1d", "SparseMaxPool2d", "SparseMaxPool3d", "SparseMaxPool4d",
    "SparseAvgPool1d", "SparseAvgPool2d", "SparseAvgPool3d",
    "AddTable", "ConcatTable", "JoinTable",
    "ToDense", "RemoveGrid",
]

# Names downstream code imports from spconv 2.x's submodules.
SUBMODULE_NAMES = {
    "spconv.pytorch.core": ["SparseConvTensor", "IndiceData", "ImplicitGemmIndiceData", "expand_nd", "scatter_nd"],
    "spconv.pytorch.modules": ["SparseModule", "SparseSequential", "is_spconv_module", "is_sparse_conv",
                               "assign_name_for_sparse_modules", "SparseBatchNorm", "SparseSyncBatchNorm",
                               "SparseReLU", "SparseIdentity"],
    "spconv.pytorch.pool": ["SparseMaxPool", "SparseAvgPool", "SparseGlobalMaxOrAvgPool", "SparseGlobalMaxPool",
                            "SparseGlobalAvgPool", "SparseMaxPool1d", "SparseMaxPool2d", "SparseMaxPool3d",
                            "SparseMaxPool4d", "SparseAvgPool1d", "SparseAvgPool2d", "SparseAvgPool3d",
                            "ALL_POOL_LAYERS"],
    "spconv.pytorch.tables": ["JoinTable", "AddTable", "AddTableMisaligned", "ConcatTable"],
    "spconv.pytorch.identity": ["Identity"],
    "spconv.pytorch.conv": ["SparseConvolution"],
    "spconv.pytorch.functional": ["SparseConvFunction", "SparseInverseConvFunction", "SparseImplicitGemmFunction",
                                  "SubMConvFunction", "SparseMaxPoolFunction", "SparseMaxPoolImplicitGemmFunction",
                                  "SparseAvgPoolImplicitGemmFunction", "indice_conv", "implicit_gemm",
                                  "indice_inverse_conv", "indice_subm_conv", "indice_maxpool",
                                  "indice_maxpool_implicit_gemm", "indice_avgpool_implicit_gemm", "sparse_add",
                                  "sparse_add_hash_based"],
    "spconv.pytorch.ops": ["get_conv_output_size", "get_deconv_output_size", "get_indice_pairs",
                           "get_indice_pairs_implicit_gemm", "indice_conv", "indice_conv_backward",
                           "implicit_gemm", "implicit_gemm_backward", "indice_maxpool", "indice_maxpool_backward",
                           "indice_maxpool_implicit_gemm", "indice_maxpool_implicit_gemm_backward",
                           "indice_avgpool_implicit_gemm", "indice_avgpool_implicit_gemm_backward",
                           "maximum_value_int_", "ConvAlgo"],
    "spconv.core": ["ConvAlgo", "AlgoHint"],
    "spconv.constants": ["SPCONV_ALLOW_TF32", "SAVED_WEIGHT_LAYOUT", "ALL_WEIGHT_IS_KRSC", "FILTER_HWIO",
                         "SPCONV_FX_TRACE_MODE", "SPCONV_DEBUG_SAVE_PATH", "SPCONV_DO_SORT", "SPCONV_CPP_GEMM",
                         "SPCONV_CPP_INDICE_PAIRS", "SPCONV_CPP_INDICE_PAIRS_IGEMM", "SPCONV_USE_DIRECT_TABLE",
                         "SPCONV_DIRECT_TABLE_HASH_SIZE_SCALE", "SPCONV_BWD_SPLITK", "SPCONV_INT8_DEBUG",
                         "SPCONV_DEBUG_WEIGHT", "DISABLE_JIT", "NDIM_DONT_CARE", "AllocKeys", "PACKAGE_NAME",
                         "PACKAGE_ROOT", "SPCONV_FORCE_NATIVE"],
}


@pytest.mark.parametrize("name", SPCONV_PYTORCH_NAMES)
def test_spconv_pytorch_name_resolves(name):
    assert getattr(spconv, name) is not None


@pytest.mark.parametrize("module,name", [(m, n) for m, names in SUBMODULE_NAMES.items() for n in names])
def test_submodule_name_resolves(module, name):
    assert getattr(importlib.import_module(module), name) is not None


def _params(cls):
    return list(inspect.signature(cls.__init__).parameters)[1:]


@pytest.mark.parametrize("cls,params", [
    (spconv.SparseMaxPool3d, ["kernel_size", "stride", "padding", "dilation", "indice_key", "algo",
                              "record_voxel_count", "name"]),
    (spconv.SparseAvgPool2d, ["kernel_size", "stride", "padding", "dilation", "indice_key", "algo",
                              "record_voxel_count", "name"]),
    (spconv.SparseGlobalMaxPool, ["name"]),
    (spconv.SparseSequential, ["args", "kwargs"]),
])
def test_constructor_signatures(cls, params):
    assert _params(cls) == params


def test_enum_members():
    assert [m.name for m in spconv.ConvAlgo] == ["Native", "MaskImplicitGemm", "MaskSplitImplicitGemm"]
    assert spconv.ops.ConvAlgo is spconv.ConvAlgo
