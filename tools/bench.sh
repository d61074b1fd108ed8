#!/usr/bin/env bash
# The main job, from a clean clone: installs what is missing, builds, runs the benchmark.
# Extra arguments go to `python -m spconv.benchmark` (e.g. --full, --data FILE.npz, --json out.json).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup_env.sh
exec "${PYTHON:-python3}" -m spconv.benchmark "$@"
