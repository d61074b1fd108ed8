#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs what is missing, builds, runs pytest.
# Extra arguments go to pytest (e.g. -k pool, --hypothesis-profile=long).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec "${PYTHON:-python3}" -m pytest test -q "$@"
