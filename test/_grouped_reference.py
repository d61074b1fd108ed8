"""The old import name of support/grouped_reference.py, kept for test files that still import it
(new tests: ``from support.grouped_reference import ...``)."""
import sys

from support import grouped_reference

sys.modules[__name__] = grouped_reference
