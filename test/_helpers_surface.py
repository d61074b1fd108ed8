"""The old import name of support/surface.py, kept for test files that still import it
(new tests: ``from support.surface import ...``)."""
import sys

from support import surface

sys.modules[__name__] = surface
