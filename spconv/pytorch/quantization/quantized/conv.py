"""int8 sparse convs (spconv 2.x: ``quantization.quantized``): per-channel symmetric qint8 weights, a float bias,
the output ``scale`` / ``zero_point``; qint8 SparseConvTensors in and out. The integer kernels (CPU: AVX-512 VNNI /
AVX2 / portable; GPU: the HIP kernels) sum int8 products exactly in int32 and requantize once per output."""
from typing import Optional

import torch
import torch.ao.nn.intrinsic as nni
from torch.ao.nn.quantized.modules.utils import WeightedQuantizedModule, _quantize_weight

from spconv.core import Activation
from spconv.pytorch import _int8, _route
from spconv.pytorch.conv import SparseConvForward, SparseConvolution, SparseConvolutionBase
from spconv.pytorch.core import SparseConvTensor
from spconv.pytorch.quantization.utils import conv_init_args, fuse_spconv_bn_weights


class _QuantizedState:
    """State dict of an int8 module, as torch's quantized modules keep it: the qint8 weight itself, the float bias,
    the output scale and zero point."""

    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "weight"] = self._weight
        destination[prefix + "bias"] = self._bias
        destination[prefix + "scale"] = torch.tensor(self.scale)
        destination[prefix + "zero_point"] = torch.tensor(self.zero_point)

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        self.set_weight_bias(state_dict.pop(prefix + "weight"), state_dict.pop(prefix + "bias"))
        self.scale = float(state_dict.pop(prefix + "scale"))
        self.zero_point = int(state_dict.pop(prefix + "zero_point"))
        super()._load_from_state_dict(state_dict, prefix, local_metadata, False, missing_keys, unexpected_keys,
                                      error_msgs)


class _SparseConv(SparseConvolutionBase, SparseConvForward, _QuantizedState, WeightedQuantizedModule):
    _FLOAT_MODULE = SparseConvolution
    _ACT = Activation.None_

    def __init__(self, ndim, in_channels, out_channels, kernel_size=3, stride=1, padding=0, dilation=1, groups=1,
                 bias=True, subm=False, output_padding=0, transposed=False, inverse=False, indice_key=None,
                 algo=None, fp32_accum=None, record_voxel_count=False, act_type=Activation.None_, act_alpha=0,
                 act_beta=0, device=None, dtype=None):
        SparseConvolutionBase.__init__(self, ndim, in_channels, out_channels, kernel_size, stride, padding, dilation,
                                       groups, bias, subm, output_padding, transposed, inverse, indice_key, algo,
                                       fp32_accum, record_voxel_count, act_type, act_alpha, act_beta)
        WeightedQuantizedModule.__init__(self)
        qweight = torch._empty_affine_quantized(self.weight_shape, scale=1, zero_point=0, dtype=torch.qint8,
                                                device=device)
        self.set_weight_bias(qweight, torch.zeros(out_channels, dtype=torch.float, device=device) if bias else None)
        self._max_voxels = torch.zeros(1, dtype=torch.int32, device=device)
        self.scale = 1.0
        self.zero_point = 0

    # ---- weights ----
    def set_weight_bias(self, qweight: torch.Tensor, bias_float: Optional[torch.Tensor]) -> None:
        self._weight = qweight
        # The int8 epilogue always adds a bias (zeros when the float conv had none), as in spconv 2.x.
        self._bias = (torch.zeros(qweight.shape[0], dtype=torch.float32, device=qweight.device)
                      if bias_float is None else bias_float.detach().float())

    def weight(self) -> torch.Tensor:
        return self._weight

    def bias(self) -> torch.Tensor:
        return self._bias

    def _weight_bias(self):
        return self._weight, self._bias

    def set_max_voxels(self, max_voxel: torch.Tensor) -> None:
        self._max_voxels = max_voxel

    def get_max_num_voxels(self) -> Optional[torch.Tensor]:
        return self._max_voxels if self.record_voxel_count and not self.subm and not self.inverse else None

    def extra_repr(self):
        s = (f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, stride={self.stride}, "
             f"scale={self.scale}, zero_point={self.zero_point}")
        if any(self.padding):
            s += f", padding={self.padding}"
        if any(d != 1 for d in self.dilation):
            s += f", dilation={self.dilation}"
        if any(self.output_padding):
            s += f", output_padding={self.output_padding}"
        if self.groups != 1:
            s += f", groups={self.groups}"
        if self.subm:
            s += ", subm=True"
        return s + f", wqscheme={self._weight.qscheme()}"

    # ---- serialization (_QuantizedState) plus the voxel counter ----
    def _save_to_state_dict(self, destination, prefix, keep_vars):
        super()._save_to_state_dict(destination, prefix, keep_vars)
        destination[prefix + "max_voxels"] = self._max_voxels.clone()

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                              error_msgs):
        if prefix + "max_voxels" in state_dict:
            self._max_voxels = state_dict.pop(prefix + "max_voxels")
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys,
                                      error_msgs)

    # ---- int8 forward ----
    def _int8_forward(self, input: SparseConvTensor, add_input: Optional[SparseConvTensor] = None):
        if not isinstance(input, SparseConvTensor) or not input.is_quantized:
            raise TypeError(f"{self._get_name()} takes a SparseConvTensor with qint8 features (quantize_per_tensor)"
                            f", got {getattr(getattr(input, 'features', None), 'dtype', type(input).__name__)}")
        if int(self.zero_point) != 0:
            raise ValueError(f"{self._get_name()}: int8 layers need symmetric output quantization, got zero_point "
                             f"{self.zero_point}")
        channel_scale = input.q_scale() * _int8.weight_scales(self._weight).to(self._bias.device) / self.scale
        act = self._ACT if self._ACT != Activation.None_ else None
        return self._conv_forward(False, input, self._weight, self._bias / self.scale, add_input=add_input,
                                  channel_scale=channel_scale, output_scale=self.scale, act_type=act)

    def forward(self, input: SparseConvTensor) -> SparseConvTensor:
        return self._int8_forward(input)

    # ---- construction from float / reference modules ----
    @classmethod
    def _from_conv(cls, conv, qweight: torch.Tensor, bias, scale: float, zero_point: int):
        q = cls(**conv_init_args(conv), bias=bias is not None, device=qweight.device)
        q.set_weight_bias(qweight, bias)
        q.scale = float(scale)
        q.zero_point = int(zero_point)
        counter = conv.get_max_num_voxels()
        if counter is not None:
            q.set_max_voxels(counter)
        return q

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant: bool = False):
        """From an observed float conv (PTQ) or a QAT conv (its weight fake quantizer gives the weight's qparams;
        a conv-bn is folded first)."""
        if hasattr(mod, "weight_fake_quant"):
            if hasattr(mod, "bn"):
                mod.weight, mod.bias = fuse_spconv_bn_weights(mod.weight, mod.bias, mod.bn.running_mean,
                                                              mod.bn.running_var, mod.bn.eps, mod.bn.weight,
                                                              mod.bn.bias)
            weight_observer = mod.weight_fake_quant
            act_observer = mod.activation_post_process
        else:
            if not hasattr(mod, "qconfig"):
                raise ValueError("the float module must have a qconfig")
            act_observer = getattr(mod, "activation_post_process", None)
            if isinstance(mod, nni._FusedModule):
                mod = mod[0]
            weight_observer = mod.qconfig.weight()
        weight_observer(mod.weight)
        if weight_observer.dtype != torch.qint8:
            raise ValueError(f"the weight observer must produce qint8, got {weight_observer.dtype}")
        qweight = _quantize_weight(mod.weight.float(), weight_observer)
        scale, zp = act_observer.calculate_qparams() if act_observer is not None else (1.0, 0)
        return cls._from_conv(mod, qweight, mod.bias, float(scale), int(zp))

    @classmethod
    def from_reference(cls, ref_qconv, output_scale, output_zero_point):
        if isinstance(ref_qconv, nni._FusedModule):
            ref_qconv = ref_qconv[0]
        return cls._from_conv(ref_qconv, ref_qconv.get_quantized_weight(), ref_qconv.bias, output_scale,
                              output_zero_point)


class SparseConv(_SparseConv):
    """int8 sparse conv: ``int8(x) * int8(w)`` summed in int32, then ``* (s_x * s_w / s_out) + bias / s_out``."""

    def _get_name(self):
        return "QuantizedSparseConvolution"


class LinearPerChannelWeight(_QuantizedState, WeightedQuantizedModule):
    """int8 linear layer with per-channel weights (torch's native quantized Linear is per-tensor on some
    engines): the int8 kernel of the sparse convs with one offset, so it runs on the CPU and the GPU alike."""
    _FLOAT_MODULE = torch.nn.Linear
    _ACT = "None_"

    def __init__(self, in_features: int, out_features: int, bias: bool = True, dtype=torch.qint8):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self._weight = torch._empty_affine_quantized([out_features, in_features], scale=1, zero_point=0,
                                                     dtype=torch.qint8)
        self._bias = torch.zeros(out_features) if bias else None
        self.scale = 1.0
        self.zero_point = 0
        self._filters = None

    def set_weight_bias(self, w: torch.Tensor, b: Optional[torch.Tensor]) -> None:
        self._weight = w
        self._bias = None if b is None else b.detach().float()
        self._filters = None

    def weight(self):
        return self._weight

    def bias(self):
        return self._bias

    def _get_name(self):
        return "QuantizedLinearPerChannelWeight"

    def extra_repr(self):
        return (f"in_features={self.in_features}, out_features={self.out_features}, scale={self.scale}, "
                f"zero_point={self.zero_point}, qscheme={self._weight.qscheme()}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not x.is_quantized:
            raise TypeError(f"{self._get_name()} takes a qint8 tensor, got {x.dtype}")
        if x.shape[-1] != self.in_features:
            raise ValueError(f"{self._get_name()} expects {self.in_features} input features, got {x.shape[-1]}")
        lead = x.shape[:-1]
        x2 = x.reshape(-1, self.in_features)
        if self._filters is None or self._filters.device != x.device:
            self._filters = _int8.quantized_weight_filters(self._weight).to(x.device)
        scale = x.q_scale() * _int8.weight_scales(self._weight).to(x.device) / self.scale
        bias = None if self._bias is None else self._bias.to(x.device) / self.scale
        out = _route.int8_conv(x2, self._filters, None, x2.shape[0], scale, bias, self.scale,
                         None, self._ACT, 0.0)
        return out.reshape(*lead, self.out_features)

    @classmethod
    def from_float(cls, mod, use_precomputed_fake_quant: bool = False):
        act_observer = getattr(mod, "activation_post_process", None)
        if isinstance(mod, nni._FusedModule):
            mod = mod[0]
        weight_observer = mod.weight_fake_quant if hasattr(mod, "weight_fake_quant") else mod.qconfig.weight()
        weight_observer(mod.weight)
        q = cls(mod.in_features, mod.out_features, mod.bias is not None)
        q.set_weight_bias(_quantize_weight(mod.weight.float(), weight_observer), mod.bias)
        if act_observer is not None:
            scale, zp = act_observer.calculate_qparams()
            q.scale, q.zero_point = float(scale), int(zp)
        return q

    @classmethod
    def from_reference(cls, ref_linear, output_scale, output_zero_point):
        if isinstance(ref_linear, nni._FusedModule):
            ref_linear = ref_linear[0]
        q = cls(ref_linear.in_features, ref_linear.out_features, ref_linear.bias is not None)
        q.set_weight_bias(ref_linear.get_quantized_weight(), ref_linear.bias)
        q.scale, q.zero_point = float(output_scale), int(output_zero_point)
        return q
