"""The old import name of support/reference.py, kept for test files that still import it
(new tests: ``from support.reference import ...``)."""
import sys

from support import reference

sys.modules[__name__] = reference
