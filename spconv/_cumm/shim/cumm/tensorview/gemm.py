"""``cumm.tensorview.gemm``: only ``Activation`` (cumm's names and values), which spconv 2.x convs take as
``act_type``; spconv's convs read it by name. Kept free of spconv imports so ``import cumm`` stays light."""
import enum

SPCONV_CUMM_SHIM = True


class Activation(enum.Enum):
    None_ = 0
    ReLU = 1
    Sigmoid = 2
    LeakyReLU = 3
