"""Builds spconv._C_hip: the native C++ route always, plus the GPU kernels when torch is a CUDA or ROCm build.

Environment:
  ROCM_PATH (default /opt/dtk), CUDA_HOME      GPU toolchains
  SPCONV_HIP_ARCHS or PYTORCH_ROCM_ARCH         AMD/Hygon targets, e.g. "gfx906;gfx90a"
  TORCH_CUDA_ARCH_LIST                          NVIDIA targets, e.g. "8.0;9.0"
  SPCONV_CPU_ONLY=1                             skip the GPU kernels even with a GPU torch
  CXX=hipcc                                     hipcc compiles the GPU kernels, the host compiler (SPCONV_HOST_CXX,
                                                default g++) the host sources; with a CPU torch: the CPU route
  SPCONV_SKIP_EXTENSION=1                       package only, around an extension already built in place
                                                (tools/build_inplace.py: incremental builds, editable install)
  SPCONV_NO_PCH=1                               no precompiled torch header for the host sources (GCC only;
                                                tools/torch_pch.py)
"""
import glob
import os
import sys
import sysconfig

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py
from setuptools.command.editable_wheel import editable_wheel

import torch
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(ROOT, "tools"))
import gpu_build  # noqa: E402  (tools/gpu_build.py: compiles csrc/hip with nvcc or hipcc)
import torch_pch  # noqa: E402  (tools/torch_pch.py: torch's headers precompiled for the host sources)

HIPCC_FROM_CXX = gpu_build.take_hipcc_from_cxx(os.environ)

VERSION = open(os.path.join(ROOT, "spconv", "_version.py")).read().split("\"")[1]


def sources(pattern):
    return sorted(os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, pattern), recursive=True))


def gpu_backend():
    if os.environ.get("SPCONV_CPU_ONLY") == "1":
        return "none"
    if torch.version.hip is not None:
        return "hip"
    if torch.version.cuda is not None:
        return "cuda"
    return "none"


backend = gpu_backend()
# C++20: torch 2.13 headers use C++20 features (bit-field initialisers).
# torch's C++ ABI, said outright (host compiler and GPU compiler): a compiler whose default differs would hand
# torch a std::string of another layout at the first op call (a crash, not a link error).
abi_flag = "-D_GLIBCXX_USE_CXX11_ABI=%d" % int(torch._C._GLIBCXX_USE_CXX11_ABI)
cxx_flags = ["-O3", "-g0", "-std=c++20", "-fopenmp", "-fvisibility=hidden", abi_flag]
macros = [("SPCONV_TORCH_VERSION", '"%s"' % torch.__version__)]
ext_sources = sources("csrc/module.cpp") + sources("csrc/ops/*.cpp") + sources("csrc/ops/cpu/*.cpp") + sources(
    "csrc/native/*.cpp")
# --exclude-libs: where the compiler driver links libstdc++ statically (some toolchain wrappers do), its
# symbols stay inside the extension; exported, they mix with the process's libstdc++ (locale facets) and the
# first number formatted into a stream crashes. No effect with the usual shared libstdc++.
ext_kwargs = dict(extra_link_args=["-fopenmp", "-Wl,--exclude-libs,ALL"], libraries=[], library_dirs=[],
                  extra_objects=[])
cmdclass = {}

if HIPCC_FROM_CXX:
    print("spconv: CXX=hipcc: %s the host sources, %s" % (os.environ["CXX"], {
        "hip": "%s the GPU kernels" % HIPCC_FROM_CXX, "cuda": "nvcc the GPU kernels (torch is a CUDA build)",
        "none": "no GPU kernels (torch has no ROCm)"}[backend]))
if backend == "none":
    print("spconv: torch %s has no CUDA/ROCm; building the CPU-only extension%s" % (
        torch.__version__, " (no GPU kernels for hipcc to compile)" if HIPCC_FROM_CXX else ""))
    macros += [("SPCONV_GPU_BACKEND", '"none"'), ("SPCONV_GPU_ARCHS", '""')]
    build_ext_cls = BuildExtension
else:
    gpu = gpu_build.configure(backend, ROOT, hipcc=HIPCC_FROM_CXX if backend == "hip" else None)
    gpu.compile_flags.append(abi_flag)
    print("spconv: building GPU kernels with %s for %s" % (gpu.compiler, gpu.archs))
    macros += [("SPCONV_GPU_BACKEND", '"%s"' % backend), ("SPCONV_GPU_ARCHS", '"%s"' % gpu.archs),
               ("SPCONV_WITH_GPU", "1")]
    macros += gpu.define_macros
    ext_sources += sources("csrc/ops/gpu/*.cpp")
    ext_kwargs["libraries"] += gpu.libraries
    ext_kwargs["library_dirs"] += gpu.library_dirs
    ext_kwargs["extra_link_args"] += gpu.extra_link_args
    cxx_flags += gpu.cxx_flags
    build_ext_cls = gpu_build.build_ext_with_gpu(BuildExtension, gpu)
build_ext_cls = torch_pch.with_torch_pch(build_ext_cls)


CUMM_PTH = os.path.join(ROOT, "spconv", "_cumm", "spconv_cumm_shim.pth")


class BuildPyWithPth(build_py):
    """Also places spconv/_cumm/spconv_cumm_shim.pth at the top of the build, so an install puts it in
    site-packages: it serves spconv's cumm stand-in at interpreter start where no real cumm is importable."""

    def run(self):
        super().run()
        self.copy_file(CUMM_PTH, os.path.join(self.build_lib, "spconv_cumm_shim.pth"))


class EditableWheelWithPth(editable_wheel):
    """The same .pth for editable installs (`pip install -e .`), whose wheel holds only the path hooks."""

    def _select_strategy(self, *args, **kwargs):
        strategy = super()._select_strategy(*args, **kwargs)

        class WithPth:
            def __enter__(self):
                strategy.__enter__()
                return self

            def __exit__(self, *exc):
                return strategy.__exit__(*exc)

            def __call__(self, wheel, files, mapping):
                strategy(wheel, files, mapping)
                with open(CUMM_PTH, "rb") as f:
                    wheel.writestr("spconv_cumm_shim.pth", f.read())

        return WithPth()


ext = CppExtension(
    "spconv._C_hip",
    ext_sources,
    # Headers too: without them an edit to a header alone would leave an in-place build "up to date".
    depends=sources("csrc/**/*.h"),
    include_dirs=[os.path.join(ROOT, "csrc", "include"), os.path.join(ROOT, "csrc")],
    define_macros=macros,
    extra_compile_args={"cxx": cxx_flags},
    **ext_kwargs,
)

# The same library serves C++ programs (spconv/share/cmake/Spconv): it needs no libtorch_python (no pybind11
# here) and no libpython (csrc/module.cpp), and gets a soname so that a program linking it finds it by rpath.
ext.libraries = [lib for lib in ext.libraries if lib != "torch_python"]
ext.extra_link_args.append("-Wl,-soname,_C_hip" + sysconfig.get_config_var("EXT_SUFFIX"))

setup(
    name="spconv-hip",
    version=VERSION,
    description="Sparse convolution for PyTorch (spconv 2.x API) with HIP GPU kernels and a native C++ route",
    packages=find_packages(include=["spconv", "spconv.*"]),
    package_data={"spconv": ["include/spconv/*.h", "share/cmake/Spconv/*.cmake"]},
    ext_modules=[] if os.environ.get("SPCONV_SKIP_EXTENSION") == "1" else [ext],
    cmdclass={"build_ext": build_ext_cls, "build_py": BuildPyWithPth,
              "editable_wheel": EditableWheelWithPth},
    python_requires=">=3.9",
    install_requires=["numpy"],
    extras_require={"bench": ["tqdm", "matplotlib"], "test": ["pytest", "hypothesis"]},
)
