"""spconv: sparse convolution for PyTorch with the spconv 2.x API (``import spconv.pytorch as spconv``)."""
from spconv._version import __version__
from spconv import constants
from spconv.core import ConvAlgo
from spconv._backend import build_info
from spconv.determinism import is_deterministic, set_deterministic

__all__ = ["__version__", "constants", "ConvAlgo", "build_info", "set_deterministic", "is_deterministic"]
