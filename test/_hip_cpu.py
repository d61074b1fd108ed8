"""The GPU code built against the HIP CPU runtime (tools/hip_cpu_build.py), for tests: its ops run the real
GPU glue and kernels on CPU tensors under ``torch.ops.spconv_hipcpu``. Skips when it can't be built here."""
import os
import sys

import pytest
import torch

_REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_LOADED = {}


def hip_cpu_ops():
    if "ops" in _LOADED:
        return _LOADED["ops"]
    sys.path.insert(0, os.path.join(_REPO, "tools"))
    try:
        import hip_cpu_build
    except ImportError:
        pytest.skip("tools/hip_cpu_build.py is not in this tree")
    finally:
        sys.path.pop(0)
    why = hip_cpu_build.missing_requirements()
    if why:
        pytest.skip(why)
    built = hip_cpu_build.build("simt")
    import spconv._backend  # noqa: F401  (the schemas' Python-side fake kernels live with the normal extension)
    torch.ops.load_library(built.path)
    _LOADED["ops"] = getattr(torch.ops, built.namespace)
    return _LOADED["ops"]
