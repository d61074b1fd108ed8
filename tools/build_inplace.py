"""Builds spconv._C_hip in place, only when something it is built from changed, and makes the tree importable.

`pip install -e .` compiles everything from scratch in a temporary directory on every call; this keeps the
objects under build/ (ninja rebuilds what changed) and a stamp of what the extension was built from (sources,
build scripts, compiler settings, torch and Python versions): an unchanged tree does not rebuild at all. The package is then installed in editable mode once, around the extension already built
(SPCONV_SKIP_EXTENSION=1), so `import spconv` works from any directory.

Usage: python tools/build_inplace.py [--force]
"""
import glob
import hashlib
import importlib.util
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAMP = os.path.join(ROOT, "build", "inplace.stamp")
# Settings read by setup.py / tools/gpu_build.py / tools/torch_pch.py that change what is compiled.
BUILD_ENV = ("SPCONV_CPU_ONLY", "TORCH_CUDA_ARCH_LIST", "SPCONV_HIP_ARCHS", "PYTORCH_ROCM_ARCH", "CUDA_HOME",
             "ROCM_PATH", "SPCONV_GPU_FLAGS", "CC", "CXX", "CFLAGS", "CXXFLAGS", "LDFLAGS")


def build_inputs():
    files = sorted(glob.glob(os.path.join(ROOT, "csrc", "**", "*"), recursive=True))
    files += [os.path.join(ROOT, "setup.py"), os.path.join(ROOT, "tools", "gpu_build.py"),
              os.path.join(ROOT, "tools", "torch_pch.py")]
    return [f for f in files if os.path.isfile(f)]


def stamp_of_tree():
    import torch  # the extension is built against this torch

    h = hashlib.sha256()
    for f in build_inputs():
        h.update(os.path.relpath(f, ROOT).encode() + b"\0")
        with open(f, "rb") as fh:
            h.update(hashlib.sha256(fh.read()).digest())
    h.update(("torch %s python %s\n" % (torch.__version__, sys.version)).encode())
    for k in BUILD_ENV:
        h.update(("%s=%s\n" % (k, os.environ.get(k, ""))).encode())
    return h.hexdigest()


def extension_files():
    return glob.glob(os.path.join(ROOT, "spconv", "_C_hip*.so")) + glob.glob(os.path.join(ROOT, "spconv", "_C_hip*.pyd"))


def read_stamp():
    try:
        with open(STAMP) as f:
            return f.read().strip()
    except OSError:
        return None


def importable_from_anywhere():
    """Does `import spconv` outside this directory find this tree? (Looked up without importing it.)"""
    here = os.getcwd()
    try:
        os.chdir(os.path.dirname(ROOT))
        sys.path = [p for p in sys.path if p not in ("", ROOT)]
        spec = importlib.util.find_spec("spconv")
    finally:
        os.chdir(here)
    origin = spec.origin if spec is not None else None
    return origin is not None and os.path.realpath(origin).startswith(os.path.join(os.path.realpath(ROOT), "spconv"))


def main(argv):
    force = "--force" in argv
    stamp = stamp_of_tree()
    if not force and extension_files() and read_stamp() == stamp:
        print("spconv: extension up to date (built from this tree; nothing to rebuild)")
    else:
        os.makedirs(os.path.dirname(STAMP), exist_ok=True)
        log = os.path.join(ROOT, "build", "inplace.log")
        print("spconv: building the extension in place (incremental; objects and log under build/)", flush=True)
        with open(log, "w") as out:
            rc = subprocess.call([sys.executable, "setup.py", "build_ext", "--inplace"], cwd=ROOT, stdout=out,
                                 stderr=subprocess.STDOUT)
        if rc != 0:
            with open(log) as f:
                sys.stderr.write("".join(f.readlines()[-60:]))
            sys.exit("spconv: the build failed (exit %d); the whole log is %s" % (rc, log))
        with open(STAMP, "w") as f:
            f.write(stamp + "\n")
    if not importable_from_anywhere():
        print("spconv: installing the package in editable mode (no rebuild)", flush=True)
        env = dict(os.environ, SPCONV_SKIP_EXTENSION="1")
        subprocess.check_call([sys.executable, "-m", "pip", "install", "-q", "--no-build-isolation", "--no-deps",
                               "-e", ROOT], env=env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL)


if __name__ == "__main__":
    main(sys.argv[1:])
