"""The old import name of support/int8_reference.py, kept for test files that still import it
(new tests: ``from support.int8_reference import ...``)."""
import sys

from support import int8_reference

sys.modules[__name__] = int8_reference
