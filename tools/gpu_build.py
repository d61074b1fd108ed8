"""Compiles the portable GPU sources (csrc/hip/*.cu) with nvcc or hipcc for setup.py.

The kernels are written once in HIP spelling (csrc/hip/hip_compat.h maps them onto CUDA); they are never
hipified. Their objects are linked into the same ``spconv._C_hip`` extension as the host code, which reaches
them through the plain C++ launchers of csrc/hip/launchers.h.

Environment:
  CUDA_HOME                          CUDA toolkit (nvcc), default: torch's guess
  TORCH_CUDA_ARCH_LIST               NVIDIA targets, e.g. "8.0;9.0" or "8.0+PTX;9.0"; default: visible GPUs, else
                                     8.0;9.0. PTX goes with the +PTX entries, else with the highest arch
  ROCM_PATH                          ROCm / DTK root (hipcc), default /opt/dtk
  SPCONV_HIP_ARCHS, PYTORCH_ROCM_ARCH AMD/Hygon targets, e.g. "gfx906;gfx926;gfx90a"; default gfx906;gfx90a
  SPCONV_GPU_JOBS                    parallel compiler processes (default: CPU count, at most 8)
  SPCONV_GPU_FLAGS                   extra flags for nvcc/hipcc
"""
import glob
import os
import re
import shlex
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor


class GpuConfig:
    def __init__(self, backend, compiler, archs, arch_flags, root):
        self.backend = backend
        self.compiler = compiler
        self.archs = archs
        self.arch_flags = arch_flags
        self.root = root
        self.define_macros = []
        self.libraries = []
        self.library_dirs = []
        self.extra_link_args = []
        self.cxx_flags = []
        self.include_dirs = [os.path.join(root, "csrc", "include"), os.path.join(root, "csrc")]
        self.compile_flags = []


def _split_list(value):
    return [v for v in re.split(r"[;,\s]+", value or "") if v]


def _cuda_archs():
    """[(major_minor '80', ptx bool)] from TORCH_CUDA_ARCH_LIST or the visible devices."""
    spec = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
    items = _split_list(spec)
    if not items:
        try:
            import torch

            caps = sorted({torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())})
            items = ["%d.%d" % c for c in caps]
        except Exception:  # pragma: no cover - no driver at build time
            items = []
    if not items:
        items = ["8.0", "9.0"]
    out = []
    for it in items:
        ptx = it.endswith("+PTX")
        num = it.replace("+PTX", "")
        named = {"Ampere": "8.0", "Hopper": "9.0", "Ada": "8.9", "Turing": "7.5", "Volta": "7.0"}
        num = named.get(num, num)
        if not re.fullmatch(r"\d+\.\d+a?", num):
            raise ValueError("TORCH_CUDA_ARCH_LIST entry %r not understood" % it)
        out.append((num.replace(".", ""), ptx))
    return out


def _arch_key(num):
    """'90a' -> (90, 'a'): the numeric order of compute capabilities ('100' after '90')."""
    m = re.fullmatch(r"(\d+)(a?)", num)
    return int(m.group(1)), m.group(2)


def cuda_arch_flags(archs):
    """nvcc -gencode flags for [(major_minor, ptx)]: a binary per arch, and PTX for the entries marked +PTX,
    or, when none is, for the highest arch, so that newer GPUs (and any arch not in the list) JIT-compile
    that PTX instead of failing with "no kernel image". Arch-specific targets ('90a') can't carry PTX
    forward: the default PTX goes to the highest plain one."""
    flags = []
    for num, _ in archs:
        flags += ["-gencode", "arch=compute_%s,code=sm_%s" % (num, num)]
    ptx = [num for num, p in archs if p]
    if not ptx:
        plain = [num for num, _ in archs if not num.endswith("a")]
        ptx = [max(plain, key=_arch_key)] if plain else []
    for num in ptx:
        flags += ["-gencode", "arch=compute_%s,code=compute_%s" % (num, num)]
    return flags


def _nvcc_top(nvcc):
    """The toolkit folder nvcc runs from, as its dry run names it (TOP): right also when the nvcc found is a
    wrapper script in another folder, which makes torch guess that folder's parent as CUDA_HOME."""
    try:
        out = subprocess.run([nvcc, "--dryrun", "-c", "spconv_probe.cu"], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    m = re.search(r"^#\$ TOP=(.+)$", out, re.M)
    return os.path.normpath(m.group(1).strip()) if m else None


def _cudart_dir(cuda_home, nvcc):
    """The folder holding libcudart.so, under CUDA_HOME or under the toolkit nvcc belongs to."""
    roots = [cuda_home] + [t for t in [_nvcc_top(nvcc)] if t and t != cuda_home]
    for r in roots:
        for sub in ("lib64", "lib", os.path.join("targets", "x86_64-linux", "lib")):
            if os.path.exists(os.path.join(r, sub, "libcudart.so")):
                return os.path.join(r, sub)
    raise RuntimeError("spconv: libcudart.so not found under %s; set CUDA_HOME to the CUDA toolkit" % roots)


def take_hipcc_from_cxx(environ):
    """``CXX=hipcc python3 setup.py build_ext --inplace`` (the Hygon DTK spelling): hipcc is the GPU compiler,
    so it compiles csrc/hip; torch's host sources go to the host C++ compiler (``SPCONV_HOST_CXX``, else g++,
    else c++), whose ABI and flags torch's headers expect. Returns hipcc's path and points ``environ["CXX"]`` at
    the host compiler, or returns None (and changes nothing) when CXX is not hipcc."""
    cxx = environ.get("CXX", "")
    words = shlex.split(cxx)
    if not words or not os.path.basename(words[0]).startswith("hipcc"):
        return None
    hipcc = shutil.which(words[0]) or words[0]
    environ["CXX"] = environ.get("SPCONV_HOST_CXX") or ("g++" if shutil.which("g++") else "c++")
    return hipcc


def configure(backend, root, hipcc=None):
    """The GPU build of ``backend`` ("cuda" or "hip"); ``hipcc``: the hip compiler to use (default: ROCM_PATH's)."""
    import torch
    from torch.utils import cpp_extension

    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    if backend == "cuda":
        cuda_home = os.environ.get("CUDA_HOME") or cpp_extension.CUDA_HOME
        if not cuda_home and shutil.which("nvcc"):
            cuda_home = os.path.dirname(os.path.dirname(os.path.realpath(shutil.which("nvcc"))))
        if not cuda_home:
            raise RuntimeError("spconv: torch is a CUDA build but no CUDA toolkit was found; set CUDA_HOME")
        nvcc = os.path.join(cuda_home, "bin", "nvcc")
        archs = _cuda_archs()
        flags = cuda_arch_flags(archs)
        cfg = GpuConfig("cuda", nvcc, ";".join("sm_%s" % a for a, _ in archs), flags, root)
        cfg.compile_flags = ["-O3", "-std=c++17", "-Xcompiler", "-fPIC", "--expt-relaxed-constexpr", "-x", "cu",
                             "-lineinfo"]
        cudart = _cudart_dir(cuda_home, nvcc)
        cfg.library_dirs = [torch_lib, cudart]
        cfg.libraries = ["c10_cuda", "torch_cuda", "cudart"]
        cfg.define_macros = [("SPCONV_GPU_CUDA", "1")]
        cfg.extra_link_args = ["-Wl,-rpath," + cudart]
        return cfg
    if backend == "hip":
        rocm = os.environ.get("ROCM_PATH") or "/opt/dtk"
        if hipcc is None:
            hipcc = os.path.join(rocm, "bin", "hipcc")
            if not os.path.exists(hipcc):
                hipcc = "hipcc"
        archs = _split_list(os.environ.get("SPCONV_HIP_ARCHS") or os.environ.get("PYTORCH_ROCM_ARCH")) or [
            "gfx906", "gfx90a"]
        flags = ["--offload-arch=%s" % a for a in archs]
        cfg = GpuConfig("hip", hipcc, ";".join(archs), flags, root)
        cfg.compile_flags = ["-O3", "-std=c++17", "-fPIC", "-x", "hip"]
        cfg.library_dirs = [torch_lib, os.path.join(rocm, "lib")]
        cfg.libraries = ["c10_hip", "torch_hip", "amdhip64"]
        cfg.define_macros = [("SPCONV_GPU_HIP", "1")]
        cfg.extra_link_args = ["-Wl,-rpath," + os.path.join(rocm, "lib")]
        return cfg
    raise ValueError("unknown GPU backend %r" % backend)


def gpu_sources(root):
    return sorted(glob.glob(os.path.join(root, "csrc", "hip", "*.cu")))


def _headers(root):
    return glob.glob(os.path.join(root, "csrc", "hip", "*.h")) + glob.glob(
        os.path.join(root, "csrc", "include", "spconv", "*.h"))


def compile_all(cfg, build_dir, force=False):
    """Compiles every GPU source into build_dir; returns the object paths. Skips up-to-date objects."""
    os.makedirs(build_dir, exist_ok=True)
    newest_header = max([os.path.getmtime(h) for h in _headers(cfg.root)] + [0])
    extra = shlex.split(os.environ.get("SPCONV_GPU_FLAGS", ""))
    env = dict(os.environ)
    if cfg.backend == "hip":
        env["HIP_PLATFORM"] = "amd"
    jobs = []
    objects = []
    for src in gpu_sources(cfg.root):
        obj = os.path.join(build_dir, os.path.basename(src) + (".cuda.o" if cfg.backend == "cuda" else ".hip.o"))
        objects.append(obj)
        if not force and os.path.exists(obj) and os.path.getmtime(obj) >= max(os.path.getmtime(src), newest_header):
            continue
        cmd = [cfg.compiler] + cfg.compile_flags + cfg.arch_flags + ["-I" + d for d in cfg.include_dirs] + [
            "-D%s=%s" % m for m in cfg.define_macros] + extra + ["-c", src, "-o", obj]
        jobs.append(cmd)

    def run(cmd):
        print(" ".join(shlex.quote(c) for c in cmd), flush=True)
        proc = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return cmd, proc.returncode, proc.stdout

    n = int(os.environ.get("SPCONV_GPU_JOBS", "0")) or min(8, os.cpu_count() or 1)
    failed = []
    with ThreadPoolExecutor(max_workers=max(1, n)) as pool:
        for cmd, rc, out in pool.map(run, jobs):
            if out.strip():
                sys.stdout.write(out)
            if rc != 0:
                failed.append(cmd[-3])
    if failed:
        raise RuntimeError("spconv: GPU compilation failed for " + ", ".join(failed))
    return objects


def build_ext_with_gpu(base, cfg):
    """A build_ext that first compiles the GPU sources and links their objects into every extension."""

    class BuildExtWithGpu(base):
        def build_extensions(self):
            objects = compile_all(cfg, os.path.join(self.build_temp, "gpu"), force=self.force)
            for ext in self.extensions:
                ext.extra_objects = list(ext.extra_objects or []) + [o for o in objects if o not in (
                    ext.extra_objects or [])]
            super().build_extensions()

    return BuildExtWithGpu
