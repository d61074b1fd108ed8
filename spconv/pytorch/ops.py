"""spconv 2.x's ``spconv.pytorch.ops``: its public functions (``get_indice_pairs``, ``indice_conv``,
``implicit_gemm``, ``indice_maxpool``, ... from ``_ops_compat``) and this package's op wrappers (``_native``) and
pooling routes (``_route``), under the names spconv 2.x code and this package's layers reach them by.

A face only: nothing below imports it. The layers call ``ops.build_kernel_map`` through this module at call time,
so that a wrapper placed here (the benchmark's map-build counter) sees every build.
"""
# spconv 2.x code reaches these through ops too (the package name included).
import spconv  # noqa: F401
from spconv import _backend  # noqa: F401
from spconv import constants  # noqa: F401
from spconv.constants import AllocKeys  # noqa: F401
from spconv.core import AlgoHint, ConvAlgo  # noqa: F401
from spconv.pytorch._maps import PairMaps, map_info_input  # noqa: F401
from spconv.pytorch._native import (_ops, build_kernel_map, get_conv_output_size,  # noqa: F401
                                    get_deconv_output_size, indice_conv_native, weight_to_filters)
from spconv.pytorch._ops_compat import (get_indice_pairs, get_indice_pairs_implicit_gemm,  # noqa: F401
                                        global_pool_rearrange, implicit_gemm, implicit_gemm_backward,
                                        indice_avgpool_implicit_gemm, indice_avgpool_implicit_gemm_backward,
                                        indice_conv, indice_conv_backward, indice_maxpool, indice_maxpool_backward,
                                        indice_maxpool_implicit_gemm, indice_maxpool_implicit_gemm_backward,
                                        maximum_value_int_)
from spconv.pytorch._route import indice_avgpool_native, indice_maxpool_native, pool_route  # noqa: F401
