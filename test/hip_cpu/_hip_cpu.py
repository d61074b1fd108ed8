"""Builds small HIP programs with the host C++ compiler against the HIP CPU runtime, and runs them.

HIP-CPU root: env HIP_CPU_ROOT, default <repo>/../shared/third_party/hip-cpu. Programs are cached by a hash of
their sources, every header they may include and the flags, in env SPCONV_HIP_CPU_CACHE (default: a folder in
the system temp dir). Missing prerequisites skip the tests, or fail them when env CI is set.
"""
import ctypes.util
import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import time

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
CXX = os.environ.get("CXX", "g++")
# -ffp-contract=off: no FMA contraction (g++ ignores the sources' clang pragmas); -march=native: fmaf inline.
FLAGS = ["-std=c++17", "-O1", "-ffp-contract=off", "-march=native", "-w", "-DSPCONV_HIP_CPU=1"]
LIBS = ["-ltbb", "-lpthread"]
# Every header a program here can include: a change to any of them rebuilds.
HEADER_DIRS = ["csrc/hip", "csrc/hip/emu", "csrc/include/spconv"]
COMPILE_TIMES = {}  # program name -> seconds, for the record


def hip_cpu_root():
    default = os.path.join(REPO, "..", "shared", "third_party", "hip-cpu")
    return os.path.abspath(os.environ.get("HIP_CPU_ROOT", default))


def _missing():
    root = hip_cpu_root()
    if not os.path.isfile(os.path.join(root, "include", "hip", "hip_runtime.h")):
        return f"HIP-CPU headers not found under {root} (set HIP_CPU_ROOT)"
    if shutil.which(CXX) is None:
        return f"{CXX} not found"
    if ctypes.util.find_library("tbb") is None:
        return "libtbb not found (libtbb-dev)"
    return None


def require():
    why = _missing()
    if why is None:
        return
    if os.environ.get("CI"):
        pytest.fail(f"HIP-CPU tests cannot run: {why}")
    pytest.skip(why)


def rewrite_launches(src):
    """`k<<<cfg>>>(args);` -> a hipLaunchKernelGGL and a device synchronisation: HIP-CPU has no <<<>>>, and
    kernels launched back to back on the null stream may overlap."""
    out, pos = [], 0
    for m in re.finditer(r"([A-Za-z_][\w:]*(?:<[^<>;()]*>)?)\s*<<<(.*?)>>>\s*\(", src, re.S):
        if m.start() < pos:
            continue
        depth, i = 1, m.end()
        while depth:
            depth += {"(": 1, ")": -1}.get(src[i], 0)
            i += 1
        args = src[m.end():i - 1].strip()
        name = f"({m.group(1)})" if "," in m.group(1) else m.group(1)  # one macro argument
        out.append(src[pos:m.start()])
        out.append(f"do {{ hipLaunchKernelGGL({name}, {m.group(2).strip()}{', ' + args if args else ''}); "
                   f"(void)hipDeviceSynchronize(); }} while (0)")
        pos = i
    out.append(src[pos:])
    return "".join(out)


def _cache_dir():
    d = os.environ.get("SPCONV_HIP_CPU_CACHE") or os.path.join(tempfile.gettempdir(), f"spconv-hip-cpu-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def build(name, sources, defines=(), rewrite=()):
    """Compiles `sources` (repo-relative) into one executable and returns its path. Sources listed in `rewrite`
    get their <<<>>> launches rewritten (into a copy in the cache folder)."""
    require()
    root = hip_cpu_root()
    flags = FLAGS + [f"-D{d}" for d in defines]
    inc = ["-isystem", os.path.join(root, "include"), "-I", os.path.join(REPO, "csrc", "hip"),
           "-I", os.path.join(REPO, "csrc", "include"), "-I", os.path.join(REPO, "csrc")]
    h = hashlib.sha256(" ".join([CXX, root] + flags + LIBS + list(sources) + list(rewrite)).encode())
    headers = [os.path.join(d, f) for d in HEADER_DIRS for f in sorted(os.listdir(os.path.join(REPO, d)))
               if f.endswith((".h", ".hpp"))]
    for rel in list(sources) + headers + [os.path.relpath(__file__, REPO)]:
        with open(os.path.join(REPO, rel), "rb") as f:
            h.update(rel.encode() + b"\0" + f.read())
    cache = _cache_dir()
    exe = os.path.join(cache, f"{name}-{h.hexdigest()[:16]}")
    if os.path.exists(exe):
        return exe
    work = tempfile.mkdtemp(dir=cache)
    try:
        files = []
        for rel in sources:
            path = os.path.join(REPO, rel)
            if rel in rewrite:
                with open(path) as f:
                    text = rewrite_launches(f.read())
                path = os.path.join(work, os.path.basename(rel))
                with open(path, "w") as f:
                    f.write(text)
            files.append(path)
        tmp = os.path.join(work, name)
        cmd = [CXX] + flags + inc + ["-x", "c++"] + files + ["-x", "none", "-o", tmp] + LIBS
        t0 = time.time()
        r = subprocess.run(cmd, capture_output=True, text=True)
        COMPILE_TIMES[name] = time.time() - t0
        if r.returncode != 0:
            pytest.fail(f"building {name} failed:\n{' '.join(cmd)}\n{r.stderr[-6000:]}")
        os.replace(tmp, exe)  # atomic: concurrent sessions see a whole program or none
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return exe


def run(exe, *args, expect_ok=True, timeout=600):
    r = subprocess.run([exe] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if expect_ok and r.returncode != 0:
        pytest.fail(f"{os.path.basename(exe)} {' '.join(map(str, args))} exited {r.returncode}:\n{r.stderr[-4000:]}")
    return r
