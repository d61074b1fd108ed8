"""Module mappings float -> QAT -> int8 (spconv 2.x: ``quantization.qmapping``)."""
from typing import Any, Callable, Dict

from spconv.pytorch.conv import DEFAULT_SPARSE_CONV_TYPES
from spconv.pytorch.quantization import intrinsic as snni
from spconv.pytorch.quantization.intrinsic import qat as snniqat
from spconv.pytorch.quantization.intrinsic import quantized as snniq
from spconv.pytorch.quantization import quantized as snnq

STATIC_SPCONV_QUANT_MODULE_MAPPINGS: Dict[Callable, Any] = {t: snnq.SparseConv for t in DEFAULT_SPARSE_CONV_TYPES}
STATIC_SPCONV_QUANT_MODULE_MAPPINGS.update({
    snni.SpconvReLUNd: snniq.SparseConvReLU,
    snniqat.SparseConvBn: snnq.SparseConv,
    snniqat.SparseConvBnReLU: snniq.SparseConvReLU,
    snniqat.SparseConvReLU: snniq.SparseConvReLU,
})

SPCONV_QAT_MODULE_MAPPINGS: Dict[Callable, Any] = {
    snni.SpconvBnNd: snniqat.SparseConvBn,
    snni.SpconvBnReLUNd: snniqat.SparseConvBnReLU,
    snni.SpconvBnAddReLUNd: snniqat.SparseConvBnAddReLU,
}


def get_spconv_qat_to_static_mapping():
    return STATIC_SPCONV_QUANT_MODULE_MAPPINGS


def get_spconv_fmod_to_qat_mapping():
    return SPCONV_QAT_MODULE_MAPPINGS
