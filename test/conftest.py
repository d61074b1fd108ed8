"""Shared pytest configuration for the spconv tests."""
import contextlib
import ctypes
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # tests import support.* (never each other)
# The launch counts profile thousands of calls; kineto would print two lines per profile.
os.environ.setdefault("KINETO_LOG_LEVEL", "6")

# ---- hypothesis: a short, reproducible profile for CI; `pytest --hypothesis-profile=long` for deep runs ----
try:
    from hypothesis import HealthCheck, settings
except ImportError:  # pragma: no cover - test_fuzz.py skips itself without hypothesis
    pass
else:
    _SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.filter_too_much]
    settings.register_profile("ci", max_examples=25, deadline=None, derandomize=True, database=None,
                              suppress_health_check=_SLOW_OK)
    settings.register_profile("long", max_examples=1000, deadline=None, suppress_health_check=_SLOW_OK)
    settings.load_profile(os.getenv("SPCONV_HYPOTHESIS_PROFILE", "ci"))


# ---- the GPU code on the CPU (HIP CPU runtime): built once per session by tools/hip_cpu_build.py ----
import pytest  # noqa: E402

from support.places import GPU_PLACES, Place  # noqa: E402

_TOOLS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tools")


_HIP_CPU_LOADED = {}


def hip_cpu_library(variant: str = "simt"):
    """torch.ops.<namespace> of one HIP CPU build variant (tools/hip_cpu_build.py), built and loaded once per
    session; fails where the runtime is missing, skips where the variant is not enabled in this tree.
    SPCONV_HIP_CPU_SOURCE_ROOT builds another tree (the mutation check uses it)."""
    if variant in _HIP_CPU_LOADED:
        return _HIP_CPU_LOADED[variant]
    hip_cpu_build = _hip_cpu_tool()
    src = os.environ.get("SPCONV_HIP_CPU_SOURCE_ROOT") or None
    if variant not in hip_cpu_build.enabled_variants(src):
        pytest.skip("HIP CPU variant %s is not enabled in this tree (needs %s)" % (
            variant, hip_cpu_build.VARIANTS[variant].requires))
    import torch
    import spconv._backend  # noqa: F401  (the normal extension first: the reference route)
    built = hip_cpu_build.load(variant, src)
    _HIP_CPU_LOADED[variant] = getattr(torch.ops, built.namespace)
    _HIP_CPU_PATHS[variant] = built.path
    if SESSION_ORDER not in THREAD_ORDERS:
        raise ValueError("SPCONV_HIP_CPU_THREAD_ORDER must be one of %s, got %r" % (THREAD_ORDERS, SESSION_ORDER))
    _order_setter(variant)(SESSION_ORDER == "descending")
    return _HIP_CPU_LOADED[variant]


_HIP_CPU_PATHS = {}
THREAD_ORDERS = ["ascending", "descending"]
# The order of every kernel outside thread_order(): the runtime's, or descending for a whole run (the mutation
# check sets it).
SESSION_ORDER = os.environ.get("SPCONV_HIP_CPU_THREAD_ORDER", "ascending")


def hip_cpu_library_path(variant: str = "simt") -> str:
    """The shared library of a variant that hip_cpu_library() loaded (for tests that load it in a subprocess)."""
    return _HIP_CPU_PATHS[variant]


def _order_setter(variant: str):
    setter = ctypes.CDLL(_HIP_CPU_PATHS[variant]).spconv_hip_cpu_set_descending  # the loaded library's handle
    setter.argtypes, setter.restype = [ctypes.c_bool], ctypes.c_bool
    return setter


@contextlib.contextmanager
def thread_order(order: str, variant: str = "simt"):
    """Inside, every kernel launched by the variant's library runs each block's threads in ``order``: the
    runtime's ascending order, or descending (csrc/hip/hip_cpu_thread_order.h), where a barrier missing between
    a write by one thread and a read by another changes the result."""
    hip_cpu_library(variant)
    setter = _order_setter(variant)
    before = setter(order == "descending")
    try:
        yield
    finally:
        setter(before)


def _hip_cpu_tool():
    """tools/hip_cpu_build.py; a missing requirement fails the test with the command that fixes it (these tests
    run on any CPU: never skipped for a dependency; `-m "not hip_cpu"` leaves them out on purpose)."""
    sys.path.insert(0, _TOOLS)
    import hip_cpu_build
    why = hip_cpu_build.missing_requirements()
    if why:
        pytest.fail("the HIP CPU tests need: " + why)
    return hip_cpu_build


def hip_cpu_program(name: str, sources, defines=()):
    """Path of a standalone program built against the HIP CPU runtime (the emulator tests' drivers)."""
    tool = _hip_cpu_tool()
    try:
        return tool.build_program(name, list(sources), list(defines),
                                  os.environ.get("SPCONV_HIP_CPU_SOURCE_ROOT") or None)
    except tool.BuildError as e:
        pytest.fail(str(e))


def run_program(exe, *args, expect_ok=True, timeout=600):
    import subprocess
    r = subprocess.run([exe] + [str(a) for a in args], capture_output=True, text=True, timeout=timeout)
    if expect_ok and r.returncode != 0:
        pytest.fail("%s %s exited %d:\n%s" % (os.path.basename(exe), " ".join(map(str, args)), r.returncode,
                                               r.stderr[-4000:]))
    return r


@pytest.fixture(scope="session")
def hip_cpu():
    """torch.ops.spconv_hipcpu: the GPU glue and kernels built for the HIP CPU runtime, on the CPU key."""
    return hip_cpu_library("simt")


@pytest.fixture(params=GPU_PLACES)
def gpu_place(request):
    """Where a test body runs the GPU code: the HIP CPU build, and a GPU when there is one (support/places.py).
    A test that parametrizes it itself (places.per_place, places.on_places) may name "hip_cpu-ascending" or
    "hip_cpu-descending": the HIP CPU build with each block's threads in that order (thread_order)."""
    name, _, order = request.param.partition("-")
    if name == "cuda":
        yield Place("cuda")
        return
    place = Place("hip_cpu", hip_cpu_library("simt"))
    with thread_order(order) if order else contextlib.nullcontext():
        yield place


# ---- markers: gpu (skipped without a GPU), hip_cpu (also every test that takes the hip_cpu fixture) ----
def gpu_present() -> bool:
    """A CUDA or ROCm device and an extension built with the GPU kernels: what a ``gpu`` test needs."""
    import torch
    from spconv import _backend
    return torch.cuda.is_available() and _backend.has_gpu_kernels()


def pytest_collection_modifyitems(config, items):
    skip_gpu = None if gpu_present() else pytest.mark.skip(
        reason="needs a CUDA or ROCm GPU and the extension built with its kernels (hip_cpu runs the same code)")
    for item in items:
        if "hip_cpu" in getattr(item, "fixturenames", ()) and item.get_closest_marker("hip_cpu") is None:
            item.add_marker(pytest.mark.hip_cpu)
        if skip_gpu is not None and item.get_closest_marker("gpu") is not None:
            item.add_marker(skip_gpu)
