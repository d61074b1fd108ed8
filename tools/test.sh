#!/usr/bin/env bash
# The whole test suite, from a clean clone: installs what is missing, builds, runs pytest.
# Extra arguments go to pytest (e.g. -k pool, --hypothesis-profile=long).
# Runs the test files on one pytest-xdist worker per CPU (--dist loadfile: a file's module fixtures, such as the
# C++ example's CMake build, run once); SPCONV_TEST_JOBS=N sets the number of workers, 0 runs in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
bash tools/setup_env.sh
JOBS=${SPCONV_TEST_JOBS:-$(nproc)}
if [ "$JOBS" -gt 1 ]; then
  exec "$PY" -m pytest test -q -n "$JOBS" --dist loadfile "$@"
fi
exec "$PY" -m pytest test -q "$@"
