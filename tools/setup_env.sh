#!/usr/bin/env bash
# Installs what the build and tests need, only where it is missing, then builds spconv._C_hip in place.
# torch: a CPU, CUDA, ROCm or DTK build already installed is used as is; with none, the CPU build
# torch==2.13.0 is installed (an unpinned `torch` would download a CUDA build of several GB).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
for mod in numpy pytest hypothesis ninja; do
  $PY -c "import $mod" 2>/dev/null || $PY -m pip install -q "$mod"
done
# cmake builds the C++ deployment example (test/test_deploy_cpp.py).
command -v cmake >/dev/null || $PY -m pip install -q cmake
# Build against the installed torch (no build isolation: an isolated build would fetch another torch).
$PY -m pip install -q --no-build-isolation -e . >/dev/null
$PY -m spconv --info >/dev/null
