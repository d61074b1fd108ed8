"""Post-training quantization and quantization-aware training of sparse networks through torch.fx, and their
int8 inference (spconv 2.x: ``spconv.pytorch.quantization``, same names and module paths).

    qconfig_mapping = get_default_spconv_qconfig_mapping(is_qat)
    prepared = torch.ao.quantization.quantize_fx.prepare_fx(model, qconfig_mapping, (),
        backend_config=get_spconv_backend_config(), prepare_custom_config=get_spconv_prepare_custom_config())
    ... calibrate (or train, with prepare_qat_fx) ...
    prepare_spconv_torch_inference(with_linear)
    converted = remove_conv_add_dq(transform_qdq(convert_fx(prepared, qconfig_mapping=..., backend_config=...)))

The converted model computes its sparse convs, max pools and per-channel linears in int8 (CPU and GPU).
"""
from .backend_cfg import (get_spconv_backend_config, get_spconv_convert_custom_config,  # noqa: F401
                          get_spconv_prepare_custom_config, prepare_spconv_torch_inference)
from .core import quantize_per_tensor  # noqa: F401
from .fake_q import (get_default_spconv_qconfig_mapping, get_default_spconv_trt_ptq_qconfig,  # noqa: F401
                     get_default_spconv_trt_qat_qconfig)
from .graph import remove_conv_add_dq, transform_qdq  # noqa: F401
from .qmapping import get_spconv_fmod_to_qat_mapping, get_spconv_qat_to_static_mapping  # noqa: F401
from .utils import fuse_spconv_bn_eval, fuse_spconv_act_eval  # noqa: F401
