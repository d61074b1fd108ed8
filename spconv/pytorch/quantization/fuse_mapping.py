"""Fuser methods of the backend config: conv + bn (+ relu) (+ add) into the intrinsic modules (PTQ folds the
bn into the conv now; QAT keeps it to train)."""
from spconv.pytorch.conv import SparseConvolution
from spconv.pytorch.quantization import intrinsic as snni
from spconv.pytorch.quantization.utils import fuse_spconv_bn_eval


def _check_bn(conv, bn):
    if bn.num_features != conv.out_channels:
        raise ValueError(f"batch norm of {bn.num_features} features after a conv of {conv.out_channels} channels")
    if not (bn.affine and bn.track_running_stats):
        raise ValueError("only batch norms with affine=True and track_running_stats=True fuse into a conv")


def _check_conv(conv, *mods):
    if not isinstance(conv, SparseConvolution):
        raise NotImplementedError(f"cannot fuse {[type(m).__name__ for m in (conv, *mods)]}")
    if any(m.training != conv.training for m in mods):
        raise ValueError("the modules to fuse must all be in training or all in eval mode")


def fuse_conv_bn(is_qat, conv, bn, is_add_fuse: bool = False):
    _check_conv(conv, bn)
    if is_qat:
        _check_bn(conv, bn)
        return (snni.SpconvAddReLUNd if is_add_fuse else snni.SpconvBnNd)(conv, bn)
    return fuse_spconv_bn_eval(conv, bn)


def fuse_conv_bn_relu(is_qat, conv, bn, relu, is_add_fuse: bool = False):
    _check_conv(conv, bn, relu)
    if is_qat:
        _check_bn(conv, bn)
        return (snni.SpconvBnAddReLUNd if is_add_fuse else snni.SpconvBnReLUNd)(conv, bn, relu)
    return (snni.SpconvAddReLUNd if is_add_fuse else snni.SpconvReLUNd)(fuse_spconv_bn_eval(conv, bn), relu)


def fuse_conv_bn_add_relu(is_qat, relu, add_pattern):
    """The pattern (relu, (add, (bn, conv), residual)) of a residual block's last conv."""
    _, bn_pattern, _ = add_pattern
    bn, conv = bn_pattern
    return fuse_conv_bn_relu(is_qat, conv, bn, relu, True)
