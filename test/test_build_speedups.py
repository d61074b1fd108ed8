"""The build's time savers change no result: tools/torch_pch.py makes a precompiled header that GCC takes (or
none where it cannot), tools/hip_cpu_build.py puts torch's precompiled headers only in front of files that
include them anyway, and two processes building the same objects at once compile each one once."""
import os
import stat
import subprocess
import sys
import threading
import time

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import hip_cpu_build  # noqa: E402
import torch_pch  # noqa: E402


@pytest.fixture
def small_pch(monkeypatch):
    monkeypatch.setattr(torch_pch, "PCH_TEXT", "#include <vector>\n#include <string>\n")  # seconds, not minutes
    monkeypatch.delenv("SPCONV_NO_PCH", raising=False)


def test_precompiled_header_is_made_once_and_taken(small_pch, tmp_path):
    before, after = ["-O1", "-DSPCONV_X=1"], ["-std=c++17"]
    flags = torch_pch.make("g++", before, after, str(tmp_path))
    assert flags[0] == "-include" and os.path.isfile(flags[1] + ".gch")
    made = os.stat(flags[1] + ".gch").st_mtime_ns
    assert torch_pch.make("g++", before, after, str(tmp_path)) == flags
    assert os.stat(flags[1] + ".gch").st_mtime_ns == made  # reused, not made again
    other = torch_pch.make("g++", before, ["-std=c++20"], str(tmp_path))
    assert other and other[1] != flags[1]  # other flags, another header

    src = tmp_path / "use.cpp"
    src.write_text("int f() { std::vector<int> v(3); return (int)v.size(); }\n")
    r = subprocess.run(["g++"] + before + flags + ["-Winvalid-pch", "-H", "-c", str(src), "-o",
                                                    str(tmp_path / "use.o")] + after, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "! " + flags[1] + ".gch" in r.stderr  # -H marks a precompiled header it used with '!'
    assert "not used because" not in r.stderr


def test_no_precompiled_header_where_it_cannot_serve(small_pch, tmp_path, monkeypatch):
    fake = tmp_path / "clang++"  # answers like clang: GCC's macros and __clang__
    fake.write_text("#!/bin/sh\necho '#define __GNUC__ 4'\necho '#define __clang__ 1'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IEXEC)
    assert torch_pch.make(str(fake), [], [], str(tmp_path)) == []
    assert torch_pch.make(str(tmp_path / "missing-compiler"), [], [], str(tmp_path)) == []
    monkeypatch.setenv("SPCONV_NO_PCH", "1")
    assert torch_pch.make("g++", [], [], str(tmp_path)) == []
    monkeypatch.delenv("SPCONV_NO_PCH")
    # A header that does not compile: no flags, so the sources compile as they are.
    monkeypatch.setattr(torch_pch, "PCH_TEXT", "#include <no_such_header_here.h>\n")
    assert torch_pch.make("g++", [], [], str(tmp_path), log=lambda m: None) == []


@pytest.mark.parametrize("rel, expected", [
    ("csrc/ops/op_namespace.cpp", False),   # no torch header anywhere in its includes
    ("csrc/ops/build_info.cpp", False),
    ("csrc/ops/checks.cpp", True),          # through checks.h
    ("csrc/ops/gpu/conv_gpu.cpp", True),    # itself
])
def test_torch_header_only_in_front_of_files_that_include_it(rel, expected):
    assert hip_cpu_build._includes_torch(os.path.join(ROOT, rel), ROOT) is expected


def test_two_builders_compile_each_object_once(tmp_path, monkeypatch):
    """Two builds of the same objects at once (as two pytest-xdist workers start): each object is compiled by
    one of them, both take part, and both return with every object in place."""
    compiled, builders_seen, lock = [], set(), threading.Lock()

    def fake_run(cmd, what):
        out = cmd[-1]
        time.sleep(0.1)
        with lock:
            compiled.append(cmd[cmd.index("-c") + 1])
            builders_seen.add(threading.current_thread().name.split("_")[0])  # ThreadPoolExecutor-<builder>_<n>
        with open(out, "w") as f:
            f.write("object")

    monkeypatch.setattr(hip_cpu_build, "_run", fake_run)
    jobs = []
    for i in range(8):
        src = tmp_path / ("k%d.cu" % i)
        src.write_text("// kernel %d\n" % i)
        obj = str(tmp_path / ("k%d.o" % i))
        jobs.append((str(src), obj, ["g++", "-c", str(src), "-o", obj]))
    builders = [threading.Thread(target=hip_cpu_build._compile, args=(jobs, str(tmp_path), 2, None, "t"))
                for _ in range(2)]
    for b in builders:
        b.start()
    for b in builders:
        b.join()
    assert sorted(compiled) == sorted(src for src, _, _ in jobs)
    assert len(builders_seen) == 2, "one builder waited for the other instead of sharing the work"
    assert all(os.path.isfile(obj) for _, obj, _ in jobs)
