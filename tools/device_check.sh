#!/usr/bin/env bash
# One-shot check on a GPU machine (NVIDIA with a CUDA build of torch, or AMD/Hygon with a ROCm/DTK build):
# builds the extension for the local GPU, times the fused / native / torch.mm routes on the reference
# SubMConv3d layer, times the project against spconv 2.3.8 and spconv-Triton on the same tensors
# (tools/device_peers.py), runs the GPU tests, a short benchmark, and compute-sanitizer (memcheck, racecheck) on
# a small normal case and a duplicate-coordinate case; prints a summary. Sized for one call of at most 6
# minutes: every phase has its own time limit, cut to what is left before DEADLINE seconds (default 320,
# leaving the unpacking of the peers and the summary inside the 6 minutes), and a
# phase with under 15 s left is skipped (the later phases first: the CPU-only tests are CI's job). What each
# phase takes on an H200: docs/gpu.md.
# Output: bench/results/device-check-<UTC date>-<GPU>.txt, bench/results/<date>-device-<GPU>.json (the peers
# table), and copies under $OUT when that is set.
#   TORCH_CUDA_ARCH_LIST (default 9.0), SPCONV_HIP_ARCHS for ROCm; SKIP_BUILD=1 reuses an existing build;
#   PEERS_TIMEOUT (default 150 s) for the peers phase.
#
# The peers (../shared/peers/README.md) travel in the ignored folder .peers/ with the real scan:
#   here, once:   echo /.peers/ >> .git/info/exclude
#                 mkdir -p .peers && cp ../shared/peers/gpu/* ../shared/data/lidar-voxels-125k.npz .peers/
#   device call (carry [".peers"]), the one command:
#     tar -xJf .peers/spconv238-cu126-py312.tar.xz -C .peers &&
#     python3 -m pip install -q --no-index --no-deps --target .peers/triton .peers/spconv_triton-*.whl &&
#     bash tools/device_check.sh
#   (the peers phase unpacks them itself when that was not done). Without .peers the peers phase writes null
#   for both peers.
set -u
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"  # tools/*.py import spconv from the in-place build
T0=$(date +%s)
elapsed() { echo $(( $(date +%s) - T0 )); }
DEADLINE=${DEADLINE:-320}
# The time limit of a phase: its cap, cut to what is left before DEADLINE (0: skip the phase).
limit() { local left=$(( DEADLINE - $(elapsed) )); [ $left -lt 15 ] && { echo 0; return; }; echo $(( left < $1 ? left : $1 )); }
cap() { local t; t=$(limit "$1"); echo $(( t > 0 ? t : 1 )); }  # for a phase that always runs (timeout 0 = none)

GPU=$(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)
[ -z "$GPU" ] && GPU=$(python3 -c "import torch; print(torch.cuda.get_device_name(0))" 2>/dev/null)
[ -z "$GPU" ] && GPU=unknown-gpu
GPU_TAG=$(echo "$GPU" | tr -c 'A-Za-z0-9._-' '-' | sed 's/-\+/-/g; s/-$//')
STAMP=$(date -u +%Y%m%d-%H%M%S)
mkdir -p bench/results
LOG=bench/results/device-check-$STAMP-$GPU_TAG.txt
exec > >(tee "$LOG") 2>&1

declare -A RESULT
LOGDIR=${OUT:-/tmp}  # full build and pytest logs (under $OUT when set); the summary shows their tails
phase() { echo; echo "=== [$(elapsed) s] $* ==="; }

phase "machine"
date -u
echo "GPU: $GPU"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || rocm-smi 2>/dev/null | head -20
python3 -c "import torch, sys; print('python', sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'hip', torch.version.hip)"
command -v nvcc >/dev/null && nvcc --version | tail -2
echo "cores: $(nproc)"
git log -1 --format='commit %H %s' 2>/dev/null || true
[ -n "$(git status --porcelain 2>/dev/null | head -1)" ] &&
  echo "(the tree differs from that commit: a copied tree may carry a stale .git)"

phase "build"
export TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0}
export MAX_JOBS=${MAX_JOBS:-$(nproc)} SPCONV_GPU_JOBS=${SPCONV_GPU_JOBS:-8}
if [ "${SKIP_BUILD:-0}" = 1 ]; then
  RESULT[build]=skipped
else
  if timeout 150 python3 setup.py build_ext --inplace >"$LOGDIR/build.log" 2>&1; then
    RESULT[build]=ok
    grep -E "building GPU kernels|nvcc|hipcc" "$LOGDIR/build.log" | head -3 | cut -c1-300
  else
    RESULT[build]=FAILED
    tail -60 "$LOGDIR/build.log"
  fi
fi
echo "build: ${RESULT[build]} at $(elapsed) s"
echo "compilers: CXX=${CXX:-} CC=${CC:-}; g++: $(g++ --version 2>/dev/null | head -1)"
[ -n "${CXX:-}" ] && echo "$CXX: $($CXX --version 2>/dev/null | head -1); default C++ ABI: $(echo '#include <string>' |
  $CXX -x c++ -dM -E - 2>/dev/null | grep -o '_GLIBCXX_USE_CXX11_ABI [01]')"
import_check() { timeout 60 python3 -c "import json, spconv._backend as b; print(json.dumps(b.build_info()))"; }
if ! import_check; then
  # Where it crashed, then one more build with the system compiler (ninja rebuilds what the new command changes).
  GDB=$(command -v cuda-gdb || ls /usr/local/cuda/bin/cuda-gdb 2>/dev/null || true)
  [ -n "$GDB" ] && [ "$(limit 60)" != 0 ] && timeout "$(limit 60)" "$GDB" -q -batch -ex run -ex bt --args python3 -c "import spconv._backend as b; \
    b.build_info()" 2>&1 | grep -E "^#|signal" | head -25
  if [ "${SKIP_BUILD:-0}" != 1 ] && [ -x /usr/bin/g++ ] && [ "$(limit 150)" != 0 ]; then
    echo "rebuilding with /usr/bin/g++ ($(/usr/bin/g++ --version | head -1))"
    CXX=/usr/bin/g++ CC=/usr/bin/g++ LDSHARED="/usr/bin/g++ -shared" timeout "$(limit 150)" \
      python3 setup.py build_ext --inplace >"$LOGDIR/build2.log" 2>&1 || tail -30 "$LOGDIR/build2.log"
  fi
  import_check || RESULT[build]="${RESULT[build]} (import FAILED)"
fi

phase "timing: SubMConv3d 3x3x3 on ~50k voxels, 41x1600x1408, kernel map cached"
timeout "$(cap 90)" python3 - <<'PY'
import os
import sys
import time

import numpy as np
import torch

import spconv._backend as backend
from spconv.pytorch import _fused

sys.path.insert(0, "tools")
import device_peers  # noqa: E402  (the scenes shared with the peers' timing)

ops = torch.ops.spconv
dev = torch.device("cuda")


def synthetic_scene(n_target=50000, seed=0):
    """The layer scene, as tools/device_peers.py builds it for the peers (one definition)."""
    return torch.from_numpy(device_peers.synthetic_scene(n_target, seed))


def bench(fn, warmup=10, iters=50):
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        fn()
        b.record()
    torch.cuda.synchronize()
    t = sorted(a.elapsed_time(b) for a, b in ev)
    return t[len(t) // 2], t[0]


class Maps:
    def __init__(self, pin, pout, poff, n_in, n_out):
        self.pair_in, self.pair_out, self.pair_offsets, self.num_in, self.num_out = pin, pout, poff, n_in, n_out
        self.cache = {}


idx = synthetic_scene().to(dev)
n = idx.shape[0]
shape = [41, 1600, 1408]
t0 = time.time()
_, pin, pout, poff, info, _ = ops.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True,
                                                   False)  # info: the host record, so the ops below never sync
torch.cuda.synchronize()
map_ms = bench(lambda: ops.get_indice_pairs(idx, 1, shape, shape, [3] * 3, [1] * 3, [1] * 3, [1] * 3, True, False),
               3, 10)[0]
P = pin.numel()
print(f"voxels {n}, pairs {P} ({P / n:.2f} per voxel); kernel map (GPU, subm) {map_ms:.3f} ms")
m = Maps(pin, pout, poff, n, n)
fused_tabs = {s: ops.build_fused_map(pin, pout, poff, n, s, info) for s in (1, 2)}
map_fused_ms = bench(lambda: ops.build_fused_map(pin, pout, poff, n, 1, info), 3, 10)[0]
print(f"fused table build {map_fused_ms:.3f} ms")
rows = []
for dtype, C in ((torch.float16, 256), (torch.float16, 128), (torch.float16, 64), (torch.bfloat16, 256),
                 (torch.float32, 64), (torch.float32, 128)):
    name = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}[dtype]
    x = torch.randn(n, C, device=dev).to(dtype)
    w = (torch.randn(27, C, C, device=dev) / (27 * C) ** 0.5).to(dtype)
    dy = torch.randn(n, C, device=dev).to(dtype)
    flops = 2.0 * P * C * C
    res = {}
    for s in (1, 2):
        res[f"fused_s{s}"] = bench(lambda: ops.fused_conv(x, w, *fused_tabs[s], info))
    res["native"] = bench(lambda: ops.indice_conv(x, w, pin, pout, poff, n, info))
    a = torch.randn(P, C, device=dev).to(dtype)
    res["torch.mm"] = bench(lambda: torch.mm(a, w[0]))
    rt = ops.build_fused_map(pout, pin, poff, n, 1, info)  # subm: the reversed map has the same row counts
    wt = w.transpose(1, 2).contiguous()
    res["fused_bwd"] = bench(lambda: (ops.fused_conv(dy, wt, *rt, info), ops.fused_conv_dfilter(x, dy, pin, pout, poff, info)))
    res["native_bwd"] = bench(lambda: ops.indice_conv_backward(x, w, dy, pin, pout, poff, info))
    ref = ops.indice_conv(x.float(), w.float(), pin, pout, poff, n)
    err = (ops.fused_conv(x, w, *fused_tabs[1]).float() - ref).norm().item()
    path = ops.fused_conv_path(x)
    if dtype == torch.float32 and ops.fused_conv_path(x, True) == "tf32":  # the TF32 bodies (TF32 allowed)
        for s in (1, 2):
            res[f"tf32_s{s}"] = bench(lambda: ops.fused_conv(x, w, *fused_tabs[s], info, True))
        res["tf32_bwd"] = bench(lambda: (ops.fused_conv(dy, wt, *rt, info, True),
                                         ops.fused_conv_dfilter(x, dy, pin, pout, poff, info, True)))
        et = (ops.fused_conv(x, w, *fused_tabs[1], None, True) - ref).norm().item() / ref.norm().item()
        path += f" (tf32: relative |fused - fp32 native| = {et:.3g})"
    if dtype != torch.float32:  # the pipelined sm_80 bodies, on request (SPCONV_FUSED_SM80, read at each launch)
        os.environ["SPCONV_FUSED_SM80"] = "1"
        if ops.fused_conv_path(x) == "sm80":
            for s in (1, 2):
                res[f"sm80_s{s}"] = bench(lambda: ops.fused_conv(x, w, *fused_tabs[s], info))
            res["sm80_bwd"] = bench(lambda: (ops.fused_conv(dy, wt, *rt, info),
                                             ops.fused_conv_dfilter(x, dy, pin, pout, poff, info)))
            e80 = (ops.fused_conv(x, w, *fused_tabs[1]).float() - ref).norm().item()
            path += f" (sm80: |fused - fp32 native| = {e80:.3g})"
        del os.environ["SPCONV_FUSED_SM80"]
    print(f"\n{name} {C}->{C}: fused body {path}, |fused - fp32 native| = {err:.3g}")
    for k, (med, best) in res.items():
        fl = flops * (2 if k.endswith("bwd") else 1)
        print(f"  {k:10s} median {med:8.4f} ms  min {best:8.4f} ms  {fl / med / 1e9:8.1f} TFLOP/s (useful)")
    rows.append((name, C, res))
print("\nSUMMARY fp16 256->256 forward: fused %.4f ms (split1) / %.4f ms (split2), native %.4f ms, torch.mm %.4f ms;"
      " target <= 0.10 ms" % (rows[0][2]["fused_s1"][0], rows[0][2]["fused_s2"][0], rows[0][2]["native"][0],
                              rows[0][2]["torch.mm"][0]))
for name, C, res in rows:
    if name == "fp16":
        sp = res["native"][0] / min(res["fused_s1"][0], res["fused_s2"][0])
        print(f"SUMMARY fp16 C={C}: fused/native forward speedup {sp:.2f}x (goal >= 2x)")
    if "tf32_s1" in res:
        f, b = min(res["tf32_s1"][0], res["tf32_s2"][0]), res["tf32_bwd"][0]
        sp = min(res["fused_s1"][0], res["fused_s2"][0]) / f
        print(f"SUMMARY {name} C={C}: TF32 body forward {f:.4f} ms ({sp:.2f}x the FP32 body; goal >= 2x), backward "
              f"{b:.4f} ms (FP32 {res['fused_bwd'][0]:.4f} ms)")
    if "sm80_s1" in res:
        f, b = min(res["sm80_s1"][0], res["sm80_s2"][0]), res["sm80_bwd"][0]
        print(f"SUMMARY {name} C={C}: pipelined sm80 body forward {f:.4f} ms, backward {b:.4f} ms; default body "
              f"{min(res['fused_s1'][0], res['fused_s2'][0]):.4f} / {res['fused_bwd'][0]:.4f} ms")
PY
RESULT[timing]=$([ $? = 0 ] && echo ok || echo FAILED)

phase "peers: ours vs spconv 2.3.8 vs spconv-Triton, same tensors (tools/device_peers.py)"
T=$(limit ${PEERS_TIMEOUT:-150})
if [ "$T" = 0 ]; then
  RESULT[peers]="skipped (no time left)"
else
  if [ -d .peers ]; then  # unpack what the command did not (../shared/peers/README.md)
    if [ ! -d .peers/site ] && ls .peers/spconv238-*.tar.xz >/dev/null 2>&1; then
      tar -xJf .peers/spconv238-*.tar.xz -C .peers
    fi
    if [ ! -d .peers/triton ] && ls .peers/spconv_triton-*.whl >/dev/null 2>&1; then
      python3 -m pip install -q --no-index --no-deps --target .peers/triton .peers/spconv_triton-*.whl
    fi
  fi
  SCAN=$(ls .peers/lidar-voxels-125k.npz shared/data/lidar-voxels-125k.npz ../shared/data/lidar-voxels-125k.npz \
    2>/dev/null | head -1)
  PEERS_JSON=bench/results/$(date -u +%Y-%m-%d)-device-$GPU_TAG.json
  timeout "$T" python3 tools/device_peers.py --device cuda --peers .peers ${SCAN:+--scan "$SCAN"} \
    --child-timeout $(( T * 2 / 5 )) --budget $(( T - 15 )) --json "$PEERS_JSON" >"$LOGDIR/peers.txt" 2>"$LOGDIR/peers.log"
  rc=$?
  cat "$LOGDIR/peers.txt"
  [ "$rc" = 0 ] || tail -30 "$LOGDIR/peers.log"
  RESULT[peers]=$([ "$rc" = 0 ] && echo "ok ($PEERS_JSON)" || echo "FAILED (rc $rc)")
  [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ] && [ -f "$PEERS_JSON" ] && cp "$PEERS_JSON" "$OUT/"
fi

# The GPU test files and the GPU cases of the files that run the GPU code on every place (their hip_cpu cases, the
# HIP CPU build's, are CI's job). The whole-network ones read $SPCONV_REAL_SCAN when set.
phase "GPU tests (test/test_gpu_*.py and test/test_pool_gpu_code.py, -m 'not hip_cpu')"
T=$(limit 120)
if [ "$T" = 0 ]; then RESULT[gpu_tests]="skipped (no time left)"; else
timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE -m "not hip_cpu" test/test_gpu_*.py \
  test/test_pool_gpu_code.py >"$LOGDIR/gpu-tests.log" 2>&1
rc=$?
tail -60 "$LOGDIR/gpu-tests.log"
RESULT[gpu_tests]=$([ "$rc" = 0 ] && echo ok || echo "FAILED (rc $rc)")
fi

phase "GPU tests of the pipelined sm_80 bodies (SPCONV_FUSED_SM80=1): fused ops and networks"
T=$(limit 60)
if [ "$T" = 0 ]; then RESULT[sm80_tests]="skipped (no time left)"; else
SPCONV_FUSED_SM80=1 timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE -m "not hip_cpu" -k "fused or network" \
  test/test_gpu_code_ops.py test/test_gpu_code_network.py >"$LOGDIR/gpu-tests-sm80.log" 2>&1
rc=$?
tail -20 "$LOGDIR/gpu-tests-sm80.log"
RESULT[sm80_tests]=$([ "$rc" = 0 ] && echo ok || echo "FAILED (rc $rc)")
fi

phase "GPU cases of the general suite (-k 'cuda or gpu')"
T=$(limit 90)
if [ "$T" = 0 ]; then RESULT[gpu_cases]="skipped (no time left)"; else
timeout "$T" python3 -m pytest -q -p no:cacheprovider -rfE -k "cuda or gpu" test/test_determinism.py \
  test/test_edge_sizes.py test/test_voxel.py test/test_modules_tables.py test/test_hash.py \
  >"$LOGDIR/gpu-cases.log" 2>&1
rc=$?
tail -30 "$LOGDIR/gpu-cases.log"
RESULT[gpu_cases]=$([ "$rc" = 0 ] && echo ok || echo "FAILED (rc $rc)")
fi

phase "benchmark (python -m spconv.benchmark)"
T=$(limit 60)
if [ "$T" = 0 ]; then
  RESULT[benchmark]="skipped (no time left)"
elif python3 -c "import spconv.benchmark.cli" 2>/dev/null; then
  DATA_ARGS=""
  for d in shared/data ../shared/data; do
    [ -f "$d/lidar-voxels-125k.npz" ] && DATA_ARGS="--data $d/lidar-voxels-125k.npz" && break
  done
  timeout "$T" python3 -m spconv.benchmark --no-progress --quick $DATA_ARGS --dtypes fp16 \
    --json "$LOGDIR/benchmark.json" >"$LOGDIR/benchmark.txt" 2>&1
  rc=$?
  tail -40 "$LOGDIR/benchmark.txt"
  RESULT[benchmark]=$([ "$rc" = 0 ] && echo ok || echo "FAILED (rc $rc)")
else
  echo "spconv.benchmark not present; skipped"
  RESULT[benchmark]=absent
fi

phase "compute-sanitizer (memcheck, racecheck): tools/device_sanitize_case.py"
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer 2>/dev/null || true)
if [ -n "$SAN" ]; then
  RESULT[sanitizer]=ok
  for tool in memcheck racecheck; do
    # optin: the normal case on the opt-in bodies (the pipelined sm_80 ones for FP16, the TF32 ones for FP32)
    for case in normal optin duplicates; do
      LEFT=$(( ${SANITIZE_UNTIL:-$DEADLINE} - $(elapsed) ))
      if [ $LEFT -lt 20 ]; then RESULT[sanitizer]="${RESULT[sanitizer]}; $tool $case skipped (no time left)"; continue; fi
      CAP=$([ $tool = racecheck ] && echo 150 || echo 60)  # racecheck runs several times longer per case
      ON=$([ $case = optin ] && echo 1 || echo 0)
      SPCONV_FUSED_SM80=$ON SPCONV_ALLOW_TF32=$ON timeout $(( LEFT < CAP ? LEFT : CAP )) "$SAN" \
        --tool $tool --error-exitcode 3 python3 tools/device_sanitize_case.py ${case/optin/normal} 2>&1 | tail -8
      rc=${PIPESTATUS[0]}
      [ "$rc" = 0 ] || RESULT[sanitizer]="${RESULT[sanitizer]}; $tool $case rc $rc"
    done
  done
else
  RESULT[sanitizer]="absent (no compute-sanitizer)"
fi

phase "summary"
echo "GPU: $GPU"
for k in build timing peers gpu_tests sm80_tests gpu_cases benchmark sanitizer; do
  [ -n "${RESULT[$k]:-}" ] && printf '  %-15s %s\n' "$k" "${RESULT[$k]}"
done
[ -s "$LOGDIR/peers.txt" ] && { echo; tail -n 14 "$LOGDIR/peers.txt"; }  # the peers table, last
echo "total $(elapsed) s; log: $LOG"
sleep 1
if [ -n "${OUT:-}" ] && [ -d "${OUT:-}" ]; then cp "$LOG" "$OUT/"; fi
