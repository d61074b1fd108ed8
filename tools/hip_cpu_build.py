"""Builds the GPU code (csrc/hip kernels + csrc/ops/gpu glue) against the HIP CPU runtime, for tests.

The same sources as the nvcc/hipcc builds, compiled by the host C++ compiler with SPCONV_HIP_CPU: the kernels
run on the CPU (one fiber per GPU thread) and the glue registers on the CPU dispatch key of an op namespace of
its own (csrc/ops/op_library.h), so ``torch.ops.<namespace>.fused_conv(cpu_tensor, ...)`` runs the real GPU
code next to the normal extension's ``torch.ops.spconv``. It is a test-only library, never installed.

Variants: one library (and op namespace) per entry of VARIANTS, each with extra defines. A variant is built
when the path it needs exists in the source tree.

Cache: objects under build/hip_cpu/objects/, keyed by the source, every header of csrc/ and of the runtime,
the flags, the compiler version and the torch version; the library under build/hip_cpu/<hash>/ keyed by its
objects. An unchanged tree reuses the library, an edited .cu rebuilds that object, an edited header all.
Only the defines a file can see enter its key: the op namespace only for the file that names it
(csrc/ops/op_namespace.cpp), a variant's defines only for the kernels it lists. So the variants share every other
object: a second variant compiles its namespace file and its kernels. torch's headers (for the glue) and the
runtime's (for the kernels) are precompiled once (_pch). Each object is compiled under a lock of its own
(_file_lock): parallel test workers building at once share the work instead of compiling an object twice.

Standalone test programs (the emulator tests): build_program() compiles a few sources against the runtime
into an executable under build/hip_cpu/programs/, cached the same way.

Usage:  python3 tools/hip_cpu_build.py [--variant NAME|all] [--source-root DIR] [--sanitize] [--jobs N]
        (prints namespace and library path per variant)
   or:  import hip_cpu_build; hip_cpu_build.build("simt").path
        hip_cpu_build.build_program("name", ["test/hip_cpu/x.cu"], ["SPCONV_EMULATE_MFMA=1"])

Environment:
  HIP_CPU_ROOT               the HIP CPU runtime (default: ../shared/third_party/hip-cpu from the repo root)
  CXX                        host compiler (default g++)
  SPCONV_HIP_CPU_OPT         optimisation level of the libraries (default -O1: the best compile/run trade-off
                             for the tests; the test programs compile at -O0)
  SPCONV_HIP_CPU_SANITIZE=1  AddressSanitizer + UBSan build (separate cache; see docs/hip_cpu.md to run it)
  SPCONV_HIP_CPU_JOBS        parallel compiles (default: CPU count)
  SPCONV_TBB_ROOT            a oneTBB prefix (include/, lib/) to use instead of the search below

oneTBB (the runtime's parallel algorithms need it) is taken from SPCONV_TBB_ROOT, else from this Python's
prefix (pip's tbb-devel puts include/ and lib/ there: no root needed; tools/setup_env.sh installs it), else from
wherever the host compiler finds libtbb.so (a system libtbb-dev).
"""
import argparse
import collections
import contextlib
import fcntl
import glob
import hashlib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Dict, List, NamedTuple, Optional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import torch_pch  # noqa: E402  (the torch headers the extension build precompiles too)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUILD_DIR = os.path.join(REPO, "build", "hip_cpu")
DEFAULT_RUNTIME = os.path.join("..", "shared", "third_party", "hip-cpu")  # relative to the repo root


class Variant(NamedTuple):
    namespace: str
    defines: List[str]
    requires: Optional[str]  # path (relative to the source root) that must exist for the variant to be built
    kernels: List[str] = []  # the csrc/hip sources the defines change (the others are shared between variants)


# Adding a variant is one line here. Namespaces must match what the tests load. The emulated matrix cores
# change only the fused bodies (SPCONV_DEVICE_WMMA / _MFMA) and the int8 body; a test checks that no other
# kernel uses them.
_EMU = os.path.join("csrc", "hip", "emu")
_FUSED = ["csrc/hip/fused_conv.cu"]
_INT8 = ["csrc/hip/quantized_conv.cu"]  # its int8 bodies: MFMA (mfma variant), NVIDIA integer MMA (wmma variant)
VARIANTS: Dict[str, Variant] = {
    "simt": Variant("spconv_hipcpu", [], None),
    "wmma": Variant("spconv_hipcpu_wmma", ["SPCONV_EMULATE_WMMA=1"], _EMU, _FUSED + _INT8),
    "mfma": Variant("spconv_hipcpu_mfma", ["SPCONV_EMULATE_MFMA=1"], _EMU, _FUSED + _INT8),
    # The pipelined forward and dfilter bodies (cp.async, ldmatrix, mma.sync m16n8k16); dinput runs the forward
    # body on a mirrored table.
    "sm80": Variant("spconv_hipcpu_sm80", ["SPCONV_EMULATE_SM80=1"], _EMU, _FUSED),
}


class BuildError(RuntimeError):
    pass


class Built(NamedTuple):
    variant: str
    namespace: str
    path: str
    reused: bool  # the library was already there


def runtime_root() -> str:
    root = os.environ.get("HIP_CPU_ROOT") or DEFAULT_RUNTIME
    return os.path.normpath(os.path.join(REPO, root))  # a relative HIP_CPU_ROOT is relative to the repo root


def sanitize_enabled(sanitize: Optional[bool] = None) -> bool:
    return os.environ.get("SPCONV_HIP_CPU_SANITIZE") == "1" if sanitize is None else bool(sanitize)


def _cxx() -> str:
    return os.environ.get("CXX", "g++")


TBB_FIX = "python3 -m pip install tbb-devel"  # the one command that provides oneTBB without root


def _tbb_prefix_ok(prefix: str) -> bool:
    return (os.path.isfile(os.path.join(prefix, "include", "oneapi", "tbb.h"))
            and os.path.exists(os.path.join(prefix, "lib", "libtbb.so")))


def tbb_prefix() -> Optional[str]:
    """The oneTBB prefix whose include/ and lib/ the build adds (SPCONV_TBB_ROOT or this Python's prefix, as
    pip's tbb-devel installs it), or None: then the host compiler's own search paths must find it."""
    for prefix in (os.environ.get("SPCONV_TBB_ROOT"), sys.prefix):
        if prefix and _tbb_prefix_ok(prefix):
            return os.path.abspath(prefix)
    if os.environ.get("SPCONV_TBB_ROOT"):
        raise BuildError("SPCONV_TBB_ROOT=%s holds no include/oneapi/tbb.h and lib/libtbb.so"
                         % os.environ["SPCONV_TBB_ROOT"])
    return None


def tbb_flags():
    """(compile flags, link flags) that find oneTBB."""
    prefix = tbb_prefix()
    if prefix is None:
        return [], ["-ltbb"]
    lib = os.path.join(prefix, "lib")
    return ["-isystem", os.path.join(prefix, "include")], ["-L" + lib, "-Wl,-rpath," + lib, "-ltbb"]


def missing_requirements() -> Optional[str]:
    """Why the library cannot be built here (a sentence that says how to fix it), or None."""
    rt = runtime_root()
    if not os.path.isfile(os.path.join(rt, "include", "hip", "hip_runtime.h")):
        return ("HIP CPU runtime headers not found at %s: set HIP_CPU_ROOT to a checkout of ROCm's HIP-CPU "
                "(github.com/ROCm/HIP-CPU)" % rt)
    try:
        found = subprocess.run([_cxx(), "-print-file-name=libtbb.so"], capture_output=True, text=True).stdout
    except OSError:
        return "host compiler %s not found" % _cxx()
    try:
        prefix = tbb_prefix()
    except BuildError as e:
        return str(e)
    if prefix is None and not os.path.isabs(found.strip()):
        return "oneTBB not found by %s nor in %s: run `%s`" % (_cxx(), sys.prefix, TBB_FIX)
    return None


def enabled_variants(source_root: Optional[str] = None) -> List[str]:
    src = source_root or REPO
    return [n for n, v in VARIANTS.items() if v.requires is None or os.path.exists(os.path.join(src, v.requires))]


def _torch_paths():
    import torch
    from torch.utils import cpp_extension
    return torch.__version__, cpp_extension.include_paths(), cpp_extension.library_paths()


def _compiler_version() -> str:
    return subprocess.run([_cxx(), "--version"], capture_output=True, text=True).stdout


def _digest(*parts) -> str:
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
        h.update(b"\0")
    return h.hexdigest()[:16]


def _tree_digest(dirs, exts) -> str:
    h = hashlib.sha256()
    for d in dirs:
        for path in sorted(glob.glob(os.path.join(d, "**", "*"), recursive=True)):
            if os.path.isfile(path) and path.endswith(exts):
                h.update(os.path.relpath(path, d).encode() + b"\0")
                with open(path, "rb") as f:
                    h.update(f.read())
    return h.hexdigest()


def _sources(src: str) -> Dict[str, str]:
    """Source path -> language ('cu' kernels, 'cxx' torch glue)."""
    out = {p: "cu" for p in sorted(glob.glob(os.path.join(src, "csrc", "hip", "*.cu")))}
    for pat in ("csrc/ops/*.cpp", "csrc/ops/gpu/*.cpp"):
        out.update({p: "cxx" for p in sorted(glob.glob(os.path.join(src, pat)))})
    return out


def _file_defines(path: str, kind: str, src: str, variant: Variant) -> List[str]:
    """The variant's defines this file can see: the namespace in the file that names SPCONV_OP_NAMESPACE
    itself (op_namespace.cpp: the schema and the glue take the name from it at run time), the variant's own
    defines in the kernels it lists."""
    out = []
    if kind == "cxx":
        with open(path, errors="replace") as f:
            if "SPCONV_OP_NAMESPACE" in f.read():
                out.append("-DSPCONV_OP_NAMESPACE=" + variant.namespace)
    if os.path.relpath(path, src).replace(os.sep, "/") in variant.kernels:
        out += ["-D" + d for d in variant.defines]
    return out


def _flags(src: str, sanitize: bool, torch_version: str, torch_inc: List[str]):
    opt = os.environ.get("SPCONV_HIP_CPU_OPT", "-O1")
    # -ffp-contract=off: g++ ignores the kernels' `#pragma clang fp contract`, and the CPU route rounds twice.
    # -march=native: otherwise fmaf is a library call. No NDEBUG: the runtime's own checks stay on.
    common = [opt, "-g0", "-fPIC", "-fvisibility=hidden", "-ffp-contract=off", "-march=native", "-pthread",
              "-DSPCONV_HIP_CPU=1", "-I" + os.path.join(src, "csrc", "include"), "-I" + os.path.join(src, "csrc")]
    if sanitize:
        common += ["-fsanitize=address,undefined", "-fno-omit-frame-pointer", "-fno-sanitize-recover=undefined"]
    cu = ["-x", "c++", "-std=c++17", "-Wno-unknown-pragmas", "-isystem", os.path.join(runtime_root(), "include")]
    cu += tbb_flags()[0]
    # C++20: torch 2.13 headers need it (as in setup.py).
    cxx = ["-std=c++20", '-DSPCONV_GPU_BACKEND="hip_cpu"', '-DSPCONV_GPU_ARCHS="host"',
           '-DSPCONV_TORCH_VERSION="%s"' % torch_version] + ["-isystem" + p for p in torch_inc]
    return common, {"cu": cu, "cxx": cxx}


def _run(cmd: List[str], what: str):
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        raise BuildError("%s failed (%s):\n%s\n%s" % (what, " ".join(shlex.quote(c) for c in cmd), r.stdout,
                                                      r.stderr[-8000:]))


def _cache_base(src: str, san: bool, torch_version: str, common: List[str]):
    """(key part shared by every object, object cache folder)."""
    headers = _tree_digest([os.path.join(src, "csrc")], (".h", ".hpp", ".cuh", ".inc"))
    runtime = _tree_digest([runtime_root()], (".h", ".hpp", ".c", ".inc", ".S"))
    # The tree's location is not part of the keys: a copy of the tree (the mutation check) reuses the objects
    # of its unchanged files (they differ only in the __FILE__ strings of error messages).
    base = _digest(_compiler_version(), torch_version, headers, runtime, " ".join(common).replace(src, "<src>"))
    cache = os.path.join(BUILD_DIR, "asan" if san else "", "objects")
    os.makedirs(cache, exist_ok=True)
    return base, cache


# Precompiled headers, made once per compiler, torch and flags and put in front (-include) of the files that
# include them anyway: torch's for every glue file that reaches them through its includes (11 s of a 12 s compile,
# 3 s with the header), the runtime's for every kernel (hip_compat.h includes it first; 4 s of 11). The -include is
# part of those objects' commands and cache keys; whether GCC took the precompiled header or parsed its text gives
# the same object.
_GLUE_PCH_TEXT = torch_pch.PCH_TEXT
_KERNEL_PCH_HEAD = "#include <cstdint>\n#include <utility>\n#include <chrono>\n"
_KERNEL_PCH_TAIL = "#include <hip/hip_runtime.h>\n#include <hip/hip_fp16.h>\n"
_IDLE_HEADER = os.path.join("csrc", "hip", "hip_cpu_idle.h")  # must precede the runtime (hip_compat.h does so)


def _kernel_pch_text(src: str) -> str:
    """The kernels' precompiled header: hip_compat.h's system and runtime includes, with the idle backoff's text
    inlined before the runtime (its content is then part of the header's cache key)."""
    with open(os.path.join(src, _IDLE_HEADER)) as f:
        return _KERNEL_PCH_HEAD + f.read() + _KERNEL_PCH_TAIL
_PCH_MIN_OBJECTS = 3  # fewer such objects to compile: making the header costs more than it saves
_TORCH_INCLUDE = re.compile(r'^\s*#\s*include\s*<(ATen|torch|c10)/', re.M)
_QUOTED_INCLUDE = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)


def _includes_torch(path: str, src: str, seen=None) -> bool:
    """Does the file include torch's headers, itself or through the project headers it includes?"""
    seen = set() if seen is None else seen
    if path in seen:
        return False
    seen.add(path)
    with open(path, errors="replace") as f:
        text = f.read()
    if _TORCH_INCLUDE.search(text):
        return True
    for name in _QUOTED_INCLUDE.findall(text):
        for d in (os.path.dirname(path), os.path.join(src, "csrc", "include"), os.path.join(src, "csrc")):
            found = os.path.normpath(os.path.join(d, name))
            if os.path.isfile(found):
                if _includes_torch(found, src, seen):
                    return True
                break
    return False


class Pch(NamedTuple):
    header: str  # what the commands -include; its .gch beside it
    text: str
    command: List[str]  # precompiles it (output last)


def _pch(cache: str, name: str, text: str, torch_version: str, flags: List[str], src: str) -> Pch:
    """The precompiled header of `text` for compile commands with these flags."""
    key = _digest(_compiler_version(), torch_version, text, " ".join(flags).replace(src, "<src>"))
    header = os.path.join(cache, "pch-" + key, name)
    return Pch(header, text, flags + ["-x", "c++-header", "-c", header, "-o", header + ".gch"])


def _write_atomically(path: str, text: str):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = path + ".tmp%d" % os.getpid()
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, path)


def _compile(jobs_list, src: str, jobs: Optional[int], log, what: str, pchs=(), min_users=_PCH_MIN_OBJECTS):
    """Compiles the (source, object, command) items whose object is not cached yet. pchs: the precompiled
    headers some commands -include; each is made first when missing and at least min_users of its users are to
    be compiled (else they read the header's text)."""
    todo = [(p, o, c) for p, o, c in jobs_list if not os.path.isfile(o)]
    n = jobs or int(os.environ.get("SPCONV_HIP_CPU_JOBS", "0")) or os.cpu_count() or 1
    to_make = []
    for pch in pchs:
        users = [item for item in todo if pch.header in item[2]]
        if users and not os.path.isfile(pch.header):
            _write_atomically(pch.header, pch.text)
        if users and not os.path.isfile(pch.header + ".gch") and len(users) >= min_users:
            to_make.append(pch)
    if log and todo:
        log("hip_cpu_build: %s: compiling %d of %d objects with %d jobs%s" % (
            what, len(todo), len(jobs_list), n,
            " (%d precompiled headers to make)" % len(to_make) if to_make else ""))

    def make_pch(pch):
        with _file_lock(pch.header + ".gch.lock"):
            if not os.path.isfile(pch.header + ".gch"):  # else made by another process meanwhile
                tmp = pch.header + ".gch.tmp%d" % os.getpid()
                _run(pch.command[:-1] + [tmp], "precompiling " + os.path.basename(pch.header))
                os.replace(tmp, pch.header + ".gch")

    def compile_one(item, wait: bool) -> bool:
        """Compiles the item unless another process has it in hand; False (without waiting) when another
        process is compiling it and wait is False."""
        path, obj, cmd = item
        with _file_lock(obj + ".lock", wait) as mine:
            if not mine:
                return False
            if os.path.isfile(obj):  # compiled by another process meanwhile
                return True
            for header, made in ready.items():
                if header in cmd:
                    made.result()
            tmp = obj + ".tmp%d" % os.getpid()
            _run(cmd[:-1] + [tmp], "compiling " + os.path.relpath(path, src))
            os.replace(tmp, obj)  # atomic: a concurrent build never sees half an object
        return True

    # Kernels first (their header is made sooner). Items another process (a second pytest-xdist worker, the
    # mutation check) is compiling are put back and waited for last, so both processes compile different objects.
    queue = collections.deque(sorted(todo, key=lambda item: not item[0].endswith(".cu")))
    deferred = collections.deque()
    guard = threading.Lock()

    def work():
        while True:
            with guard:
                wait = not queue
                if not queue and not deferred:
                    return
                item = queue.popleft() if queue else deferred.popleft()
            if not compile_one(item, wait):
                with guard:
                    deferred.append(item)

    with ThreadPoolExecutor(max_workers=n) as pool:
        ready = {pch.header: pool.submit(make_pch, pch) for pch in to_make}
        for f in [pool.submit(work) for _ in range(n)]:
            f.result()


@contextlib.contextmanager
def _file_lock(path: str, wait: bool = True):
    """Holds an exclusive lock on path (made if missing); yields False at once, holding nothing, when another
    process holds it and wait is False."""
    with open(path, "a") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def build(variant: str = "simt", source_root: Optional[str] = None, sanitize: Optional[bool] = None,
          jobs: Optional[int] = None, log=None) -> Built:
    """Builds (or reuses) the library of one variant from source_root (default: this repository)."""
    if variant not in VARIANTS:
        raise BuildError("unknown variant %r (known: %s)" % (variant, ", ".join(VARIANTS)))
    why = missing_requirements()
    if why:
        raise BuildError(why)
    src = os.path.abspath(source_root or REPO)
    v = VARIANTS[variant]
    san = sanitize_enabled(sanitize)
    torch_version, torch_inc, torch_lib = _torch_paths()
    common, lang = _flags(src, san, torch_version, torch_inc)
    base, cache = _cache_base(src, san, torch_version, common)

    pchs = {"cxx": _pch(cache, "glue_pch.h", _GLUE_PCH_TEXT, torch_version, [_cxx()] + lang["cxx"] + common, src),
            "cu": _pch(cache, "kernel_pch.h", _kernel_pch_text(src), torch_version, [_cxx()] + lang["cu"] + common, src)}
    jobs_list = []
    for path, kind in _sources(src).items():
        extra = _file_defines(path, kind, src, v)
        uses_pch = kind == "cu" or _includes_torch(path, src)
        front = ["-include", pchs[kind].header] if uses_pch else []
        with open(path, "rb") as f:
            key = _digest(base, kind, " ".join(lang[kind] + extra), pchs[kind].text if front else "",
                          os.path.relpath(path, src), f.read())
        obj = os.path.join(cache, "%s-%s.o" % (os.path.basename(path).replace(".", "_"), key))
        cmd = [_cxx()] + lang[kind] + common + extra + front + ["-c", path, "-o", obj]
        jobs_list.append((path, obj, cmd))
    if not any(p.endswith(".cu") for p, _, _ in jobs_list):
        raise BuildError("no csrc/hip/*.cu under %s" % src)

    link = ["-shared", "-Wl,-z,defs"] + ["-L" + p for p in torch_lib] + ["-Wl,-rpath," + p for p in torch_lib]
    link += ["-lc10", "-ltorch_cpu", "-ltorch"] + tbb_flags()[1] + ["-lpthread"]
    if san:
        link = ["-fsanitize=address,undefined"] + link
    lib_key = _digest(*[o for _, o, _ in jobs_list], " ".join(link))
    out_dir = os.path.join(BUILD_DIR, "asan" if san else "", lib_key)
    lib = os.path.join(out_dir, "libspconv_hipcpu_%s.so" % variant)
    if os.path.isfile(lib):
        return Built(variant, v.namespace, lib, True)
    _compile(jobs_list, src, jobs, log, variant, pchs.values())
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mktemp(dir=out_dir, suffix=".so")
    _run([_cxx()] + common[:1] + [o for _, o, _ in jobs_list] + ["-o", tmp] + link, "linking " + lib)
    os.replace(tmp, lib)  # atomic: a process linking the same library beside this one writes the same file
    return Built(variant, v.namespace, lib, False)


def build_program(name: str, sources: List[str], defines: List[str] = (), source_root: Optional[str] = None,
                  jobs: Optional[int] = None, log=None) -> str:
    """Builds (or reuses) a standalone executable from sources (test programs, relative to this repository)
    against the runtime and the csrc/ headers of the source root, with the kernels' flags (at -O0) plus defines;
    csrc/hip is on the include path. Returns its path."""
    why = missing_requirements()
    if why:
        raise BuildError(why)
    src = os.path.abspath(source_root or REPO)
    san = sanitize_enabled(None)
    torch_version, torch_inc, _ = _torch_paths()
    library_common, lang = _flags(src, san, torch_version, torch_inc)
    # -O0: the programs run a few tiles through the emulators, and compile in a third of -O1's time.
    program_common = ["-O0"] + library_common[1:]
    common = program_common + ["-I" + os.path.join(src, "csrc", "hip")] + ["-D" + d for d in defines]
    base, cache = _cache_base(src, san, torch_version, common)
    # The kernels' header at the programs' level: their defines and include path do not reach the runtime's headers.
    kernel_pch = _pch(cache, "kernel_pch.h", _kernel_pch_text(src), torch_version,
                      [_cxx()] + lang["cu"] + program_common, src)
    jobs_list = []
    for rel in sources:
        path = os.path.join(REPO, rel)
        with open(path, "rb") as f:
            key = _digest(base, " ".join(lang["cu"]), kernel_pch.text, rel, f.read())
        obj = os.path.join(cache, "%s-%s.o" % (os.path.basename(path).replace(".", "_"), key))
        jobs_list.append((path, obj, [_cxx()] + lang["cu"] + common + ["-include", kernel_pch.header, "-c", path,
                                                                       "-o", obj]))
    link = tbb_flags()[1] + ["-lpthread"] + (["-fsanitize=address,undefined"] if san else [])
    out_dir = os.path.join(BUILD_DIR, "asan" if san else "", "programs", _digest(*[o for _, o, _ in jobs_list]))
    exe = os.path.join(out_dir, name)
    if os.path.isfile(exe):
        return exe
    _compile(jobs_list, src, jobs, log, name, [kernel_pch], min_users=1)
    os.makedirs(out_dir, exist_ok=True)
    tmp = tempfile.mktemp(dir=out_dir)
    _run([_cxx()] + common[:1] + ["-pthread"] + [o for _, o, _ in jobs_list] + ["-o", tmp] + link,
         "linking " + name)
    os.replace(tmp, exe)
    return exe


def load(variant: str = "simt", source_root: Optional[str] = None, **kw) -> Built:
    """Builds and loads one variant into this process (its namespace then exists under torch.ops)."""
    import torch
    b = build(variant, source_root, **kw)
    torch.ops.load_library(b.path)
    return b


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--variant", default="simt", help="one of %s, or 'all' (the enabled ones)" % ", ".join(VARIANTS))
    ap.add_argument("--source-root", default=None, help="tree to build (default: this repository)")
    ap.add_argument("--sanitize", action="store_true", help="AddressSanitizer + UBSan build")
    ap.add_argument("--jobs", type=int, default=None)
    a = ap.parse_args(argv)
    names = enabled_variants(a.source_root) if a.variant == "all" else [a.variant]
    try:
        for name in names:
            b = build(name, a.source_root, sanitize=True if a.sanitize else None, jobs=a.jobs,
                      log=lambda m: print(m, file=sys.stderr))
            print("%s %s %s" % (b.namespace, b.path, "(reused)" if b.reused else "(built)"))
    except BuildError as e:
        print("hip_cpu_build: %s" % e, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
