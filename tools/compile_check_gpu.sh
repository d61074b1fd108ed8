#!/usr/bin/env bash
# Compile check of the GPU code without a GPU: every csrc/hip/*.cu with nvcc (sm_80, sm_90) and with hipcc
# (gfx906, gfx90a), the int8 kernel's body on each target (dp4a sm_75, mma s8 sm_80, sdot4 gfx906, MFMA
# gfx90a), the GPU glue csrc/ops/gpu/*.cpp with the host C++ compiler against the installed torch headers
# (syntax only), and the static budgets of the sm_80 tensor-core bodies' SASS (tools/sass_budget.py) and of the
# MFMA forward body's gfx90a ISA (tools/mfma_budget.py). Exits non-zero on any error.
#   NVCC=...  HIPCC=...  CXX=...          compilers (defaults: nvcc from PATH or CUDA_HOME, hipcc, g++)
#   SPCONV_SKIP_HIPCC=1 / SPCONV_SKIP_NVCC=1  skip one dialect (CI should not)
#   JOBS=N                                parallel compiles (default 2)
#   --part device | host                  one half: the device code (nvcc/hipcc compiles, int8 bodies, MFMA budget;
#                                         needs no Python package, so CI runs it while the Python setup installs)
#                                         or the host side (torch-header glue checks, SASS budget). Default: both.
set -u
PART=all
if [ "${1:-}" = "--part" ]; then PART=${2:-}; fi
case $PART in all|device|host) ;; *) echo "compile_check_gpu: --part takes device or host, got '$PART'" >&2; exit 2;; esac
device() { [ "$PART" != host ]; }
host() { [ "$PART" != device ]; }
cd "$(dirname "$0")/.."
ROOT=$(pwd)
JOBS=${JOBS:-2}
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
export HIP_PLATFORM=amd   # nvcc on the PATH would make hipcc pick the NVIDIA platform

NVCC=${NVCC:-$(command -v nvcc || true)}
if [ -z "$NVCC" ] && [ -n "${CUDA_HOME:-}" ] && [ -x "$CUDA_HOME/bin/nvcc" ]; then NVCC=$CUDA_HOME/bin/nvcc; fi
if [ -z "$NVCC" ] && [ -x /usr/local/cuda/bin/nvcc ]; then NVCC=/usr/local/cuda/bin/nvcc; fi
HIPCC=${HIPCC:-$(command -v hipcc || true)}
if [ -z "$HIPCC" ] && [ "${SPCONV_SKIP_HIPCC:-0}" != 1 ] && device; then
  echo "compile_check_gpu: hipcc not found, installing it"
  bash tools/install_system_deps.sh || true
  HIPCC=$(command -v hipcc || true)
fi
CXX=${CXX:-g++}

INC="-I$ROOT/csrc/include -I$ROOT/csrc"
jobs_file=$OUT/jobs.txt
: >"$jobs_file"
TORCH_INC=
host && TORCH_INC=$(${PYTHON:-python3} -c "import os, torch; print(os.path.join(os.path.dirname(torch.__file__), 'include'))" 2>/dev/null || true)
GLUE_FLAGS="-std=c++17 -DSPCONV_WITH_GPU=1 $INC -I$TORCH_INC -I$TORCH_INC/torch/csrc/api/include"
# torch's headers precompiled once for the glue checks (a check parses them for 8 of its 10 s). The first job
# makes it; a check that starts before it is there reads the header's text instead, as fast as without it.
GLUE_PCH=$OUT/glue_pch.h
printf '#include <ATen/ATen.h>\n#include <torch/library.h>\n' >"$GLUE_PCH"
make_pch() {  # header flags...: header.gch, renamed into place when complete
  local header=$1
  shift
  "$@" -x c++-header "$header" -o "$header.gch.tmp" && mv "$header.gch.tmp" "$header.gch"
}
export -f make_pch
if [ -n "$TORCH_INC" ]; then
  echo "pch torch-headers make_pch $GLUE_PCH $CXX $GLUE_FLAGS" >>"$jobs_file"
fi
for f in csrc/hip/*.cu; do
  [ -e "$f" ] && device || continue
  b=$(basename "$f")
  if [ "${SPCONV_SKIP_NVCC:-0}" != 1 ]; then
    if [ -z "$NVCC" ]; then echo "compile_check_gpu: nvcc not found" >&2; exit 1; fi
    echo "nvcc $f $NVCC -c -std=c++17 -O3 -x cu --expt-relaxed-constexpr -Xcompiler -fPIC -gencode arch=compute_80,code=sm_80 -gencode arch=compute_90,code=sm_90 $INC $f -o $OUT/$b.cuda.o" >>"$jobs_file"
  fi
  if [ "${SPCONV_SKIP_HIPCC:-0}" != 1 ]; then
    if [ -z "$HIPCC" ]; then echo "compile_check_gpu: hipcc not available" >&2; exit 1; fi
    echo "hipcc $f $HIPCC -std=c++17 -O3 -fPIC -x hip --offload-arch=gfx906 --offload-arch=gfx90a $INC -c $f -o $OUT/$b.hip.o" >>"$jobs_file"
  fi
done

if host; then
  if [ -z "$TORCH_INC" ]; then
    echo "compile_check_gpu: torch not importable; cannot run the glue check" >&2
    exit 1
  fi
  for f in csrc/ops/gpu/*.cpp; do
    [ -e "$f" ] || continue
    echo "g++ $f $CXX $GLUE_FLAGS -include $GLUE_PCH -fsyntax-only $f" >>"$jobs_file"
  done
fi

run_one() {  # prints ok/FAIL with the job's wall and CPU seconds (where the check's time goes)
  local tool=$1 file=$2
  shift 2
  local log t0 rc cpu
  log=$(mktemp)
  t0=$(date +%s.%N)
  # `times` in the subshell: the user and system time of the command it ran (its children's line)
  ( "$@" >"$log" 2>&1; rc=$?; times >"$log.cpu"; exit $rc )
  rc=$?
  cpu=$(tail -1 "$log.cpu" | sed 's/m/ /g; s/s//g' | awk '{ printf "%.0f", 60 * $1 + $2 + 60 * $3 + $4 }')
  local took="($(awk -v a="$t0" -v b="$(date +%s.%N)" 'BEGIN { printf "%.0f", b - a }') s, cpu $cpu s)"
  rm -f "$log.cpu"
  if [ $rc -eq 0 ]; then
    echo "ok   $tool $file $took"
    rm -f "$log"
  else
    echo "FAIL $tool $file $took"
    sed 's/^/    /' "$log" | head -60
    rm -f "$log"
    return 1
  fi
}
export -f run_one

start=$(date +%s)
status=0
# Each line: tool file command...; xargs runs JOBS at a time and returns 123 if any failed.
tr '\n' '\0' <"$jobs_file" | xargs -0 -P "$JOBS" -I{} bash -c 'run_one $1' _ {} || status=1
# (the line is passed as one word; run_one re-splits it)

# The int8 kernel's body per target (the names quantized_conv_path reports at run time): its instruction must be
# in the device code, so a target that silently fell back to the plain-C body fails here.
body_check() {  # name target instruction command...
  local name=$1 target=$2 insn=$3
  shift 3
  if "$@" 2>/dev/null | grep -q "$insn"; then
    echo "ok   int8 body $name on $target ($insn)"
  else
    echo "FAIL int8 body $name on $target: no $insn in the device code"
    status=1
  fi
}
Q=csrc/hip/quantized_conv.cu
if [ "${SPCONV_SKIP_NVCC:-0}" != 1 ] && device; then
  NV="$NVCC -std=c++17 -O3 -x cu --expt-relaxed-constexpr $INC -ptx -o -"
  body_check dp4a sm_75 dp4a $NV -arch=compute_75 $Q
  body_check mma_s8 sm_80 "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32" $NV -arch=compute_80 $Q
fi
if [ "${SPCONV_SKIP_HIPCC:-0}" != 1 ] && device; then
  HC="$HIPCC -std=c++17 -O3 -x hip --cuda-device-only -S $INC -o -"
  body_check sdot4 gfx906 v_dot4_i32_i8 $HC --offload-arch=gfx906 $Q
  body_check mfma_i8 gfx90a v_mfma_i32_16x16x16i8 $HC --offload-arch=gfx90a $Q
fi
# The pipelined sm_80 body's static budget on the SASS (instructions per MMA in its main loops, cp.async present,
# no local memory), figures in this log. cuobjdump and nvdisasm come from pip's NVIDIA packages where missing.
if [ "${SPCONV_SKIP_NVCC:-0}" != 1 ] && host; then
  PY=${PYTHON:-python3}
  if ! $PY tools/sass_budget.py --find >/dev/null; then
    $PY -m pip install -q nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm >/dev/null 2>&1 || true
  fi
  if $PY tools/sass_budget.py --find >/dev/null; then
    $PY tools/sass_budget.py || status=1
  else
    echo "FAIL sass budget: no cuobjdump (pip install nvidia-cuda-cuobjdump nvidia-cuda-nvdisasm)"
    status=1
  fi
fi
# The MFMA forward body's static budget on the gfx90a ISA (instructions per m16n8k16-equivalent in its main loop,
# no scratch), figures in this log.
if [ "${SPCONV_SKIP_HIPCC:-0}" != 1 ] && device; then
  HIPCC=$HIPCC ${PYTHON:-python3} tools/mfma_budget.py || status=1
fi
case $PART in
  device) what="the int8 bodies and the MFMA budget" ;;
  host) what="the SASS budget" ;;
  *) what="the int8 bodies and the SASS and MFMA budgets" ;;
esac
echo "compile_check_gpu ($PART): $(wc -l <"$jobs_file") compiles, $what in $(( $(date +%s) - start )) s, status $status"
exit $status
