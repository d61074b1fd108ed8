#!/usr/bin/env bash
# Installs what the build, tests and benchmark need, only where it is missing, then builds spconv._C_hip in
# place. torch: a CPU, CUDA, ROCm or DTK build already installed is used as is; with none, the CPU build
# torch==2.13.0 is installed (an unpinned `torch` would download a CUDA build of several GB).
# The build is incremental (ninja objects kept under build/) and skipped when nothing it depends on changed
# (tools/build_inplace.py keeps a stamp of the sources, flags and torch version).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
$PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0"
# import name:pip name. pytest-xdist runs the tests on every CPU (tools/test.sh); tqdm and matplotlib give the
# benchmark its progress bar and plot.
# The missing ones go to one pip call: each call costs its own start and index lookups.
missing=()
for pkg in numpy:numpy pytest:pytest hypothesis:hypothesis ninja:ninja setuptools:setuptools wheel:wheel \
           xdist:pytest-xdist tqdm:tqdm matplotlib:matplotlib; do
  $PY -c "import ${pkg%%:*}" 2>/dev/null || missing+=("${pkg##*:}")
done
# oneTBB for the HIP CPU build that runs csrc/hip on the CPU in the tests (tools/hip_cpu_build.py looks in this
# Python's prefix first): pip's tbb-devel, so that no root or system package is needed.
$PY -c "import os, sys; sys.exit(not os.path.isfile(os.path.join(sys.prefix, 'include', 'oneapi', 'tbb.h')))" ||
  missing+=(tbb-devel)
# cmake builds the C++ deployment example (test/test_deploy_cpp.py).
command -v cmake >/dev/null || missing+=(cmake)
if [ ${#missing[@]} -gt 0 ]; then
  $PY -m pip install -q "${missing[@]}"
fi
$PY tools/build_inplace.py
$PY -m spconv --info >/dev/null
