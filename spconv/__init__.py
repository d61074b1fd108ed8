"""spconv: sparse convolution for PyTorch with the spconv 2.x API (``import spconv.pytorch as spconv``)."""
from spconv._version import __dev_tag__, __version__
from spconv import _cumm

# Serves the cumm stand-in where no real cumm is importable (an install also does this at interpreter start).
_cumm.install()
from spconv import constants
from spconv.core import AlgoHint, ConvAlgo
from spconv._backend import build_info
from spconv.determinism import is_deterministic, set_deterministic

# spconv 2.x defines this beside __version__; clients compare it as a list of ints.
SPCONV_VERSION_NUMBERS = list(map(int, __version__.split(".")))

__all__ = ["__version__", "SPCONV_VERSION_NUMBERS", "constants", "AlgoHint", "ConvAlgo", "build_info",
           "set_deterministic", "is_deterministic"]
