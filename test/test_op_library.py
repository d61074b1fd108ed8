"""The op library is usable from C++ without Python: spconv/_C_hip*.so needs neither libpython nor
libtorch_python (its one Python symbol is weak), has a soname, exports spconv_build_info, and a build ships
the public header and the CMake config with the package; the source archive holds everything the build needs."""
import glob
import os
import re
import shutil
import subprocess
import sys
import tarfile

import pytest

import spconv._backend  # noqa: F401  (the extension is built)

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LIBRARY = glob.glob(os.path.join(os.path.dirname(spconv._backend.__file__), "_C_hip*.so"))[0]


def _tool(name):
    path = shutil.which(name)
    if path is None:
        pytest.skip(name + " not found")
    return path


def test_no_python_libraries_needed_and_a_soname():
    dyn = subprocess.run([_tool("readelf"), "-d", LIBRARY], check=True, capture_output=True, text=True).stdout
    needed = [line.split("[")[1].rstrip("]") for line in dyn.splitlines() if "(NEEDED)" in line]
    assert not [n for n in needed if "python" in n], needed
    assert "(SONAME)" in dyn and os.path.basename(LIBRARY) in dyn


def test_python_symbols_are_weak_and_the_c_entry_point_is_exported():
    nm = _tool("nm")
    undefined = subprocess.run([nm, "-D", "--undefined-only", LIBRARY], check=True, capture_output=True,
                               text=True).stdout.splitlines()
    strong_py = [line for line in undefined if line.split()[-1].startswith("Py") and line.split()[0] != "w"]
    assert not strong_py, strong_py
    defined = subprocess.run([nm, "-D", "--defined-only", LIBRARY], check=True, capture_output=True, text=True).stdout
    assert " T spconv_build_info" in defined


def test_build_ships_the_header_and_the_cmake_config(tmp_path):
    res = subprocess.run([sys.executable, "setup.py", "-q", "build_py", "--build-lib", str(tmp_path)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    for rel in ("spconv/include/spconv/ops.h", "spconv/share/cmake/Spconv/SpconvConfig.cmake"):
        assert (tmp_path / rel).is_file(), rel


def test_source_archive_holds_what_setup_py_builds_from(tmp_path):
    """An sdist made with any torch (here a CPU one) carries the GPU kernels and glue, the tools setup.py imports
    and the files it copies: a GPU machine builds the wheel from it. Before: csrc/hip, csrc/ops/gpu and tools/
    were missing, and setup.py failed at its first import."""
    # A fresh egg-info: setuptools would otherwise also pack what an earlier archive's file list named.
    (tmp_path / "egg").mkdir()
    res = subprocess.run([sys.executable, "setup.py", "-q", "egg_info", "--egg-base", str(tmp_path / "egg"), "sdist",
                          "-d", str(tmp_path)], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    (archive,) = glob.glob(str(tmp_path / "*.tar.gz"))
    with tarfile.open(archive) as tar:
        held = {name.split("/", 1)[1] for name in tar.getnames() if "/" in name}
    with open(os.path.join(ROOT, "setup.py")) as f:
        tools = re.findall(r"^import (\w+)  # noqa: E402", f.read(), re.M)
    assert tools, "setup.py's imports from tools/ not found"
    needed = ["tools/%s.py" % t for t in tools] + ["setup.py", "spconv/_cumm/spconv_cumm_shim.pth"]
    needed += [os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", "*"), recursive=True)
               if p.endswith((".cpp", ".h", ".cu", ".cuh"))]
    missing = [n for n in needed if n not in held]
    assert not missing, missing


def test_a_statically_linked_libstdcxx_stays_inside(tmp_path):
    """Some toolchains' compiler drivers link libstdc++ statically (a wrapper adding -static-libstdc++). Its
    symbols must stay inside the extension (setup.py links with --exclude-libs,ALL): exported, they mixed with
    the process's libstdc++, and the first number streamed into build_info's JSON crashed the process (seen on
    a GPU machine's image) or came out garbled (here). Relinks the objects of the in-place build."""
    if not glob.glob(os.path.join(ROOT, "build", "temp.*", "csrc")):
        pytest.skip("no in-place build tree to relink (the extension was built elsewhere)")
    env = dict(os.environ, LDFLAGS="-static-libstdc++")
    build = subprocess.run([sys.executable, "setup.py", "build_ext", "--build-lib", str(tmp_path)], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=600)
    assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
    lib = glob.glob(str(tmp_path / "spconv" / "_C_hip*.so"))[0]
    code = ("import json, torch; torch.ops.load_library(%r); info = json.loads(torch.ops.spconv.build_info()); "
            "print(info['openmp'], info['cpu_isa'])" % lib)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.split()[0].isdigit(), run.stdout


# Operators that only tests, benchmarks and tools call: csrc/ops/debug_schema.cpp registers them into
# spconv_debug (the HIP CPU build's variants: <namespace>_debug, with its launch ledger), apart from the user's
# spconv schema (csrc/ops/schema.cpp) that C++ deployments link against.
DIAGNOSTICS = {"host_copy_count", "cpu_output_cache_info", "cpu_fma_peak_loop", "cpu_parallel_region_info",
               "cpu_parallel_region_set_budget"}


def _ops_of(namespace):
    import torch

    prefix = namespace + "::"
    return {n[len(prefix):] for n in torch._C._dispatch_get_all_op_names() if n.startswith(prefix)}


def test_public_schema_holds_no_diagnostic():
    public, debug = _ops_of("spconv"), _ops_of("spconv_debug")
    assert {"indice_conv", "get_indice_pairs", "build_info", "cpu_output_cache_clear"} <= public
    assert debug == DIAGNOSTICS
    looks_diagnostic = [n for n in public if n.startswith("debug_") or n.endswith(("_count", "_loop"))
                        or any(w in n for w in ("budget", "ledger", "stall", "peak", "parallel_region", "cache_info"))]
    assert not looks_diagnostic, looks_diagnostic
