"""``python -m spconv.benchmark``: see ``--help``."""
import sys

from spconv.benchmark.cli import main

if __name__ == "__main__":
    sys.exit(main())
