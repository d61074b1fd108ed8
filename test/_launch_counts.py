"""The old import name of support/launch_counts.py, kept for test files that still import it
(new tests: ``from support.launch_counts import ...``)."""
import sys

from support import launch_counts

sys.modules[__name__] = launch_counts
