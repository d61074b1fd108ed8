"""Sparse convolution modules (spconv 2.x: ``spconv.pytorch.conv``).

Weights are ``[Cout, *kernel_size, Cin]`` and biases ``[Cout]`` with spconv 2.x's parameter names, so spconv 2.x
checkpoints load unchanged. Routes: kernel volume 1 is one GEMM (``features @ weight.view(Cin, Cout)``, a
reinterpretation exactly as spconv 2.x does it); GPU tensors take the fused gather-GEMM-scatter route where
eligible; everything else takes the native gather -> GEMM -> scatter route.
"""
import math
from typing import List, Optional, Tuple, Union

import numpy as np
import torch
from torch import nn
from torch.nn import init
from torch.nn.parameter import Parameter

from spconv import constants
from spconv.core import Activation, ConvAlgo
from spconv.pytorch import _checkpoint, _grouped, _int8, _route, ops
# ImplicitGemmIndiceData: spconv 2.x code imports it from this module.
from spconv.pytorch.core import (ImplicitGemmIndiceData, IndiceData, SparseConvTensor,  # noqa: F401
                                 check_unique_indices, expand_nd)
from spconv.pytorch._symsize import check_equal
from spconv.pytorch import functional as Fsp  # noqa: F401  (spconv 2.x names it so here)
from spconv.pytorch.functional import conv_features
from spconv.pytorch.modules import SparseModule
from spconv.pytorch._activation import _activation_name, apply_activation

IntOrSeq = Union[int, List[int], Tuple[int, ...]]


# spconv 2.x's default algo: implicit GEMM up to this kernel volume (128 with large_kernel_fast_algo), else Native.
# Every algo computes the same numbers here; the value is kept for repr, checkpoints and shared indice keys.
_IMPLICIT_GEMM_MAX_KV = 32
_IMPLICIT_GEMM_MAX_KV_LARGE = 128

# Buffer spconv 2.x registers with record_voxel_count (int32 [1]; saved in checkpoints).
_MAX_NUM_VOXELS_DURING_TRAINING = "max_num_voxels_during_training"


class SparseConvolutionBase:
    """The geometry of a sparse conv (spconv 2.x keeps it in this torch-free base; same signature)."""

    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size: IntOrSeq = 3,
                 stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
                 bias: bool = True, subm: bool = False, output_padding: IntOrSeq = 0, transposed: bool = False,
                 inverse: bool = False, indice_key: Optional[str] = None, algo: Optional[ConvAlgo] = None,
                 fp32_accum: Optional[bool] = None, record_voxel_count: bool = False,
                 act_type=Activation.None_, act_alpha: float = 0, act_beta: float = 0,
                 large_kernel_fast_algo: bool = False):
        if not 1 <= ndim <= 4:
            raise ValueError(f"ndim must be 1..4, got {ndim}")
        if int(in_channels) <= 0 or int(out_channels) <= 0:
            raise ValueError(f"in_channels and out_channels must be positive, got {in_channels}, {out_channels}")
        groups = _grouped.check_groups(int(in_channels), int(out_channels), groups)
        if algo is not None and not isinstance(algo, ConvAlgo):
            raise TypeError(f"algo must be a spconv.core.ConvAlgo or None, got {algo!r}")
        self.ndim = ndim
        self.in_channels = int(in_channels)
        self.out_channels = int(out_channels)
        self.kernel_size = expand_nd(ndim, kernel_size, "kernel_size")
        self.stride = expand_nd(ndim, stride, "stride")
        self.padding = expand_nd(ndim, padding, "padding")
        self.dilation = expand_nd(ndim, dilation, "dilation")
        self.output_padding = expand_nd(ndim, output_padding, "output_padding")
        for name_, vals, low in (("kernel_size", self.kernel_size, 1), ("stride", self.stride, 1),
                                 ("dilation", self.dilation, 1), ("padding", self.padding, 0),
                                 ("output_padding", self.output_padding, 0)):
            if any(v < low for v in vals):
                raise ValueError(f"{name_} entries must be >= {low}, got {vals}")
        kv = int(np.prod(self.kernel_size))
        self.conv1x1 = kv == 1
        if not subm:
            self.conv1x1 &= int(np.prod(self.stride)) == 1
            if self.conv1x1 and any(self.padding):
                raise ValueError("padding must be zero for a 1x1 conv (kernel 1, stride 1), as in spconv 2.x")
        self.transposed = transposed
        self.inverse = inverse
        self.groups = groups
        self.subm = subm
        self.indice_key = indice_key
        self.record_voxel_count = record_voxel_count
        if algo is None:
            limit = _IMPLICIT_GEMM_MAX_KV_LARGE if large_kernel_fast_algo else _IMPLICIT_GEMM_MAX_KV
            algo = ConvAlgo.MaskImplicitGemm if kv <= limit else ConvAlgo.Native
        self.algo = algo
        self.fp32_accum = fp32_accum
        self.large_kernel_fast_algo = large_kernel_fast_algo
        self.act_type = act_type
        self._act = _activation_name(act_type)
        self.act_alpha = act_alpha
        self.act_beta = act_beta
        if self.conv1x1 and self._act != "None_":
            raise ValueError("a 1x1 conv doesn't take a fused activation (as in spconv 2.x)")
        # Per group, as torch.nn.ConvNd: [Cout, *kernel, Cin/groups] (groups=1: spconv 2.x's KRSC weight).
        self.weight_shape = [self.out_channels, *self.kernel_size, self.in_channels // groups]


def _int8_args_check(conv, features, weight, channel_scale, output_scale, add_input):
    if not (features.is_quantized and weight.is_quantized):
        raise TypeError(f"{type(conv).__name__}: int8 needs quantized features and a quantized weight, got "
                        f"features {features.dtype} and weight {weight.dtype} (run the model through "
                        "spconv.pytorch.quantization's convert)")
    if channel_scale is None or output_scale is None:
        raise ValueError(f"{type(conv).__name__}: an int8 convolution needs channel_scale and output_scale "
                         "(a static quantized module passes them)")
    if conv.groups != 1:
        raise NotImplementedError(f"{type(conv).__name__}: int8 grouped convolution (groups={conv.groups}) is not "
                                  "supported; leave this layer in float (qconfig None)")
    if add_input is not None and not add_input.is_quantized:
        raise TypeError(f"{type(conv).__name__}: the residual of an int8 conv-add must be quantized, got "
                        f"{add_input.features.dtype}")


class SparseConvForward:
    """The convolution body shared by the float convs and the int8 ones (``quantization.quantized``), which keep
    their weight elsewhere: geometry from SparseConvolutionBase, kernel maps from the input's indice_dict."""

    takes_sparse_tensor = True  # SparseSequential hands it the SparseConvTensor (is_spconv_module)

    def _out_spatial_shape(self, spatial_shape: List[int]) -> List[int]:
        if self.subm or self.inverse:  # an inverse conv takes its shape from the stored map
            return list(spatial_shape)
        if self.transposed:
            return ops.get_deconv_output_size(spatial_shape, self.kernel_size, self.stride, self.padding,
                                              self.dilation, self.output_padding)
        return ops.get_conv_output_size(spatial_shape, self.kernel_size, self.stride, self.padding, self.dilation)

    def _finish(self, x: torch.Tensor, bias: Optional[torch.Tensor], add_input: Optional[SparseConvTensor],
                act: str, alpha: float) -> torch.Tensor:
        if bias is not None:
            x = x + bias
        if add_input is not None:
            x = x + add_input.features
        return apply_activation(x, act, alpha)

    def _conv_forward(self, training: bool, input: SparseConvTensor, weight: torch.Tensor,
                      bias: Optional[torch.Tensor], add_input: Optional[SparseConvTensor] = None,
                      channel_scale: Optional[torch.Tensor] = None, output_scale: Optional[float] = None,
                      name: Optional[str] = None, sparse_unique_name: str = "", act_type=None,
                      act_alpha: Optional[float] = None, act_beta: Optional[float] = None) -> SparseConvTensor:
        """spconv 2.x's convolution body with the weight and bias given (QAT passes fake-quantized weights, the
        fused conv-bn modules folded ones). ``add_input`` is added before the activation (conv-add-relu).
        With quantized features and weight it is the int8 convolution: ``channel_scale`` is
        ``input_scale * weight_scales / output_scale``, ``bias`` is divided by ``output_scale`` already and the
        result is qint8 with scale ``output_scale`` (the residual and activation are applied in the kernel)."""
        if not isinstance(input, SparseConvTensor):
            raise TypeError(f"{type(self).__name__} expects a SparseConvTensor, got {type(input).__name__}")
        input.check_consistent(type(self).__name__)
        if add_input is not None:
            add_input.check_consistent(f"{type(self).__name__} add_input")
        act = self._act if act_type is None else _activation_name(act_type)
        alpha = self.act_alpha if act_alpha is None else act_alpha
        features = input.features
        if features.shape[1] != self.in_channels:
            raise ValueError(f"channel size mismatch: {type(self).__name__} expects {self.in_channels} input "
                             f"channels, features have {features.shape[1]}")
        if len(input.spatial_shape) != self.ndim:
            raise ValueError(f"{type(self).__name__} is {self.ndim}-D but the input's spatial_shape is "
                             f"{input.spatial_shape}")
        int8 = features.is_quantized or weight.is_quantized
        if int8:
            _int8_args_check(self, features, weight, channel_scale, output_scale, add_input)
        else:
            device_type = features.device.type
            if torch.is_autocast_enabled(device_type):
                # spconv 2.x casts conv inputs to the autocast dtype (FP16 on GPU); on CPU that dtype is BF16.
                dtype = torch.get_autocast_dtype(device_type)
                features, weight = features.to(dtype), weight.to(dtype)
                bias = None if bias is None else bias.to(dtype)
            elif weight.dtype != features.dtype:
                raise TypeError(f"features dtype {features.dtype} differs from the weight dtype {weight.dtype}")
        spatial_shape = input.spatial_shape
        out_spatial_shape = self._out_spatial_shape(spatial_shape)

        # A kernel-volume-1 inverse conv still restores the coordinates stored under its key (spconv 2.x would
        # return the downsampled ones), reading its weight like any other inverse conv.
        restore = self.inverse and input.find_indice_pair(self.indice_key) is not None
        if self.conv1x1 and not restore:
            if int8:
                out = self._int8_conv(features, weight, None, features.shape[0], channel_scale, bias, output_scale,
                                      add_input, act, alpha, True)
            elif self.groups != 1:
                out = _route.conv1x1_grouped(features, _grouped.weight_to_grouped_filters(weight, self.groups))
                out = self._finish(out, bias, add_input, act, alpha)
            else:
                out = _route.conv1x1(features, weight.view(self.in_channels, self.out_channels))
                out = self._finish(out, bias, add_input, act, alpha)
            return input.with_structure(out, input.indices, out_spatial_shape, input.indice_dict)

        indice_dict = input.indice_dict.copy()
        datas = input.find_indice_pair(self.indice_key)
        if self.inverse:
            if self.indice_key is None:
                raise ValueError(f"{type(self).__name__} needs the indice_key of the conv it inverts")
            if datas is None:
                raise ValueError(f"{type(self).__name__}: no kernel map stored under indice_key "
                                 f"{self.indice_key!r}; run the SparseConv/SparseMaxPool with that key first")
            if datas.is_subm:
                raise ValueError(f"indice_key {self.indice_key!r} holds a submanifold conv's map; an inverse conv "
                                 "undoes a regular conv or a max-pool")
            self._check_inverse_reuse_valid(input, datas)
            outids = datas.indices
            maps = datas.maps.reversed()
            out_spatial_shape = datas.spatial_shape
        elif datas is not None:
            if not (self.subm and datas.is_subm):
                raise ValueError(f"indice_key {self.indice_key!r} already exists in this tensor; only submanifold "
                                 "convs at the same resolution may share a key")
            self._check_subm_reuse_valid(input, datas)
            outids = datas.out_indices
            maps = datas.maps
        else:
            if constants.SPCONV_CHECK_DUPLICATES and not self.subm:  # subm checks in the kernel-map builder
                check_unique_indices(input.indices)
            outids, maps = ops.build_kernel_map(input.indices, input.batch_size, spatial_shape, out_spatial_shape,
                                                self.kernel_size, self.stride, self.padding, self.dilation,
                                                self.subm, self.transposed)
            if self.indice_key is not None:
                indice_dict[self.indice_key] = IndiceData(
                    outids, input.indices, maps, spatial_shape, out_spatial_shape, is_subm=self.subm,
                    algo=self.algo, ksize=self.kernel_size, stride=self.stride, dilation=self.dilation,
                    padding=self.padding)
        counter = self.get_max_num_voxels()
        if counter is not None:  # spconv 2.x records in training and inference alike
            ops.maximum_value_int_(counter, outids.shape[0])
        if int8:
            out = self._int8_conv(features, weight, maps, outids.shape[0], channel_scale, bias, output_scale,
                                  add_input, act, alpha)
        else:
            if self.groups != 1:
                out = _route.conv_grouped(features, _grouped.weight_to_grouped_filters(weight, self.groups), maps,
                                            outids.shape[0])
            else:
                out = conv_features(features, _route.layer_filters(self, weight, features), maps, outids.shape[0])
            out = self._finish(out, bias, add_input, act, alpha)
        return input.with_structure(out, outids, out_spatial_shape, indice_dict)

    def _int8_conv(self, features, qweight, maps, num_out, channel_scale, bias, output_scale, add_input, act, alpha,
                   plain_1x1: bool = False) -> torch.Tensor:
        cached = getattr(self, "_int8_filters_cache", None)
        # the int8 [kvol, Cin, Cout] filters, once per weight and device (a model moved keeps its weight objects)
        if cached is None or cached[0] is not qweight or cached[1].device != features.device:
            if plain_1x1:
                filters, scales = _int8.reinterpreted_1x1(qweight)
                cached = (qweight, filters.to(features.device), (scales / _int8.weight_scales(qweight)).to(
                    features.device))
            else:
                cached = (qweight, _int8.quantized_weight_filters(qweight).to(features.device), None)
            self._int8_filters_cache = cached
        if cached[2] is not None:  # the 1x1 matrix's own column scales replace the stored weight's
            channel_scale = channel_scale.to(features.device) * cached[2]
        residual = None if add_input is None else add_input.features
        return _route.int8_conv(features, cached[1], maps, num_out, channel_scale, bias, output_scale, residual,
                                act, alpha)

    def _check_subm_reuse_valid(self, inp: SparseConvTensor, datas: IndiceData):
        key = self.indice_key
        if self.kernel_size != datas.ksize:
            raise ValueError(f"subm layers sharing indice_key {key!r} must have the same kernel_size: stored "
                             f"{datas.ksize}, this layer {self.kernel_size}")
        if self.dilation != datas.dilation:
            raise ValueError(f"subm layers sharing indice_key {key!r} must have the same dilation: stored "
                             f"{datas.dilation}, this layer {self.dilation}")
        if inp.spatial_shape != datas.spatial_shape:
            raise ValueError(f"subm layers sharing indice_key {key!r} must see the same spatial_shape: stored "
                             f"{datas.spatial_shape}, input {inp.spatial_shape}")
        check_equal(inp.indices.shape[0], datas.indices.shape[0],
                    f"subm layers sharing indice_key {key!r} must see the same voxels (voxel count)")

    def _check_inverse_reuse_valid(self, inp: SparseConvTensor, datas: IndiceData):
        key = self.indice_key
        if self.kernel_size != datas.ksize:
            raise ValueError(f"inverse conv with indice_key {key!r} must have the kernel_size of the conv it "
                             f"inverts: expected {datas.ksize}, this layer {self.kernel_size}")
        if inp.spatial_shape != datas.out_spatial_shape:
            raise ValueError(f"inverse conv with indice_key {key!r} expects spatial_shape "
                             f"{datas.out_spatial_shape} (the inverted conv's output), input {inp.spatial_shape}")
        check_equal(inp.indices.shape[0], datas.out_indices.shape[0],
                    f"inverse conv with indice_key {key!r} expects the voxels of the inverted conv's output "
                    "(voxel count)")


class SparseConvolution(SparseConvolutionBase, SparseConvForward, SparseModule):
    __constants__ = ["stride", "padding", "dilation", "groups", "bias", "subm", "inverse", "transposed",
                     "output_padding"]

    def __init__(self, ndim: int, in_channels: int, out_channels: int, kernel_size: IntOrSeq = 3,
                 stride: IntOrSeq = 1, padding: IntOrSeq = 0, dilation: IntOrSeq = 1, groups: int = 1,
                 bias: bool = True, subm: bool = False, output_padding: IntOrSeq = 0, transposed: bool = False,
                 inverse: bool = False, indice_key: Optional[str] = None, algo: Optional[ConvAlgo] = None,
                 fp32_accum: Optional[bool] = None, record_voxel_count: bool = False,
                 act_type=Activation.None_, act_alpha: float = 0, act_beta: float = 0,
                 large_kernel_fast_algo: bool = False, name: Optional[str] = None, device=None, dtype=None):
        SparseModule.__init__(self, name=name)
        SparseConvolutionBase.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                       groups, bias, subm, output_padding, transposed, inverse, indice_key, algo,
                                       fp32_accum, record_voxel_count, act_type, act_alpha, act_beta,
                                       large_kernel_fast_algo)
        factory = {"device": device, "dtype": dtype}
        if record_voxel_count and not subm and not inverse:
            self.register_buffer(_MAX_NUM_VOXELS_DURING_TRAINING, torch.zeros(1, dtype=torch.int32, device=device))
        self.weight = Parameter(torch.zeros(*self.weight_shape, **factory))
        if bias:
            self.bias = Parameter(torch.zeros(self.out_channels, **factory))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        # A pre-hook, not a _load_from_state_dict override, so that a replaced SparseModule._load_from_state_dict
        # (mmdetection3d's spconv 1.x weight permute) reaches the convs as it does in spconv 2.x.
        self._register_load_state_dict_pre_hook(_checkpoint.load_pre_hook, with_module=True)

    def get_max_num_voxels(self) -> Optional[torch.Tensor]:
        """The largest output voxel count seen (record_voxel_count=True), else None."""
        return self._buffers.get(_MAX_NUM_VOXELS_DURING_TRAINING)

    def reset_parameters(self):
        # kaiming_uniform_(a=sqrt(5)) on the KRSC layout: bound = 1 / sqrt(fan_in), fan_in = Cin * kvol.
        fan_in = self.in_channels // self.groups * int(np.prod(self.kernel_size))
        bound = 1.0 / math.sqrt(fan_in)
        init.uniform_(self.weight, -bound, bound)
        if self.bias is not None:
            init.uniform_(self.bias, -bound, bound)

    def is_inverseable(self) -> bool:
        return self.indice_key is not None and not self.subm

    def extra_repr(self):
        # spconv 2.x's text: padding, dilation and output_padding are always printed.
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"padding={self.padding}, dilation={self.dilation}, output_padding={self.output_padding}")
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.algo is not None:
            s += f", algo={self.algo}"
        if self._act != "None_":
            s += f", act=Activation.{self._act}"
        return s

    def forward(self, input: SparseConvTensor) -> SparseConvTensor:
        return self._conv_forward(self.training, input, self.weight, self.bias)


# The Nd classes take spconv 2.3.8's arguments in its order, with its defaults, so a positional call means what it
# means there. This package's additions (fused activations; output_padding for transposed convs) come after
# ``name``, keyword-only.


class _SubMConvNd(SparseConvolution):
    _NDIM = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 indice_key=None, algo: Optional[ConvAlgo] = None, fp32_accum: Optional[bool] = None,
                 large_kernel_fast_algo: bool = False, name=None, *, act_type=Activation.None_, act_alpha=0,
                 act_beta=0):
        super().__init__(self._NDIM, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         subm=True, indice_key=indice_key, algo=algo, fp32_accum=fp32_accum, act_type=act_type,
                         act_alpha=act_alpha, act_beta=act_beta, large_kernel_fast_algo=large_kernel_fast_algo,
                         name=name)


class _SparseConvNd(SparseConvolution):
    _NDIM = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 indice_key=None, algo: Optional[ConvAlgo] = None, fp32_accum: Optional[bool] = None,
                 record_voxel_count: bool = False, large_kernel_fast_algo: bool = False, name=None, *,
                 act_type=Activation.None_, act_alpha=0, act_beta=0):
        super().__init__(self._NDIM, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         indice_key=indice_key, algo=algo, fp32_accum=fp32_accum,
                         record_voxel_count=record_voxel_count, act_type=act_type, act_alpha=act_alpha,
                         act_beta=act_beta, large_kernel_fast_algo=large_kernel_fast_algo, name=name)


class _SparseConvTransposeNd(SparseConvolution):
    _NDIM = 0

    def __init__(self, in_channels, out_channels, kernel_size, stride=1, padding=0, dilation=1, groups=1, bias=True,
                 indice_key=None, algo: Optional[ConvAlgo] = None, fp32_accum: Optional[bool] = None,
                 record_voxel_count: bool = False, large_kernel_fast_algo: bool = False, name=None, *,
                 output_padding=0, act_type=Activation.None_, act_alpha=0, act_beta=0):
        super().__init__(self._NDIM, in_channels, out_channels, kernel_size, stride, padding, dilation, groups, bias,
                         output_padding=output_padding, transposed=True, indice_key=indice_key, algo=algo,
                         fp32_accum=fp32_accum, record_voxel_count=record_voxel_count, act_type=act_type,
                         act_alpha=act_alpha, act_beta=act_beta, large_kernel_fast_algo=large_kernel_fast_algo,
                         name=name)


class _SparseInverseConvNd(SparseConvolution):
    _NDIM = 0

    def __init__(self, in_channels, out_channels, kernel_size, indice_key, bias=True,
                 algo: Optional[ConvAlgo] = None, fp32_accum: Optional[bool] = None,
                 large_kernel_fast_algo: bool = False, name=None, *, groups=1, act_type=Activation.None_,
                 act_alpha=0, act_beta=0):
        # groups: keyword-only (spconv 2.x's inverse conv has no such argument).
        super().__init__(self._NDIM, in_channels, out_channels, kernel_size, groups=groups, bias=bias, inverse=True,
                         indice_key=indice_key, algo=algo, fp32_accum=fp32_accum, act_type=act_type,
                         act_alpha=act_alpha, act_beta=act_beta, large_kernel_fast_algo=large_kernel_fast_algo,
                         name=name)


class SubMConv1d(_SubMConvNd):
    _NDIM = 1


class SubMConv2d(_SubMConvNd):
    _NDIM = 2


class SubMConv3d(_SubMConvNd):
    _NDIM = 3


class SubMConv4d(_SubMConvNd):
    _NDIM = 4


class SparseConv1d(_SparseConvNd):
    _NDIM = 1


class SparseConv2d(_SparseConvNd):
    _NDIM = 2


class SparseConv3d(_SparseConvNd):
    _NDIM = 3


class SparseConv4d(_SparseConvNd):
    _NDIM = 4


class SparseConvTranspose1d(_SparseConvTransposeNd):
    _NDIM = 1


class SparseConvTranspose2d(_SparseConvTransposeNd):
    _NDIM = 2


class SparseConvTranspose3d(_SparseConvTransposeNd):
    _NDIM = 3


class SparseConvTranspose4d(_SparseConvTransposeNd):
    _NDIM = 4


class SparseInverseConv1d(_SparseInverseConvNd):
    _NDIM = 1


class SparseInverseConv2d(_SparseInverseConvNd):
    _NDIM = 2


class SparseInverseConv3d(_SparseInverseConvNd):
    _NDIM = 3


class SparseInverseConv4d(_SparseInverseConvNd):
    _NDIM = 4


# Every concrete conv class (spconv 2.x: the quantization passes match on these types).
DEFAULT_SPARSE_CONV_TYPES = {
    SubMConv1d, SubMConv2d, SubMConv3d, SubMConv4d, SparseConv1d, SparseConv2d, SparseConv3d, SparseConv4d,
    SparseInverseConv1d, SparseInverseConv2d, SparseInverseConv3d, SparseInverseConv4d,
    SparseConvTranspose1d, SparseConvTranspose2d, SparseConvTranspose3d, SparseConvTranspose4d,
}
