"""One library's side of ``layer_host_time.py``: times one small SubM layer per request, on one thread.

Started as ``python layer_host_worker.py MODULE`` under the interpreter of the library to time; imports only
torch, numpy and MODULE (a ``spconv.pytorch``-compatible package). ``MODULE:gpu-code`` (this package only) runs
the layer through the GPU route on the CPU (the HIP CPU build of the GPU glue and kernels, as the launch ledger
does) and reports each call's time outside the kernels' bodies: the host time of the GPU route. Reads requests from stdin, one JSON object a
line (``{"case": ..., "calls": N, "warmup": W, "voxels": V, "channels": C}``), and answers each with one JSON
line ``{"us": [per-call wall microseconds], "cpu_us": [the calling thread's CPU microseconds], "kernel_us": [the
time inside kernels, left out of the wall time; 0 but in gpu-code mode]}`` (``{"error": ...}`` when the case fails there);
an empty line ends it.

Cases (SubMConv3d 3x3x3, C -> C, bias, ``indice_key``, V voxels on a 16^3 grid, batch 1):
  * ``infer_cached`` / ``infer_build``: forward under ``torch.no_grad``, kernel map stored under the key /
    built in the call;
  * ``train_cached`` / ``train_build``: forward, then backward of a fixed gradient (dX and dW).
"""
import importlib
import json
import os
import sys
import time


def _scene(np, torch, voxels, channels):
    rng = np.random.default_rng(0)
    lin = rng.choice(16 ** 3, voxels, replace=False)
    coords = np.stack([np.zeros(voxels, np.int64), lin // 256, (lin // 16) % 16, lin % 16], 1).astype(np.int32)
    feats = torch.from_numpy(rng.standard_normal((voxels, channels)).astype(np.float32))
    grad = torch.from_numpy(rng.standard_normal((voxels, channels)).astype(np.float32))
    return feats, torch.from_numpy(coords), grad


def _case(sp, torch, name, feats, indices, grad):
    torch.manual_seed(0)
    channels = feats.shape[1]
    layer = sp.SubMConv3d(channels, channels, 3, indice_key="k")
    x = sp.SparseConvTensor(feats, indices, [16, 16, 16], 1)
    with torch.no_grad():
        stored = layer(x).indice_dict  # the kernel map under "k", as a previous layer sharing the key leaves it
    cached = sp.SparseConvTensor(feats, indices, [16, 16, 16], 1, indice_dict=stored)
    inp = cached if name.endswith("_cached") else x
    if name.startswith("infer"):
        def run():
            with torch.no_grad():
                return layer(inp)
        return run
    tf = feats.clone().requires_grad_(True)
    tinp = sp.SparseConvTensor(tf, indices, [16, 16, 16], 1, indice_dict=stored if name.endswith("_cached") else None)

    def step():
        y = layer(tinp)
        y.features.backward(grad)
        return y
    return step


class _KernelTime:
    """Nanoseconds spent inside kernel launches (bodies included) so far: the HIP CPU build's launch ledger, or 0."""

    def __init__(self, debug=None):
        self.debug = debug

    def __call__(self) -> int:
        return int(self.debug.debug_launch_ledger()[1]) if self.debug is not None else 0


def _gpu_code_on_cpu():
    """Enters the GPU route on CPU tensors for the rest of the process; returns its kernel-time reader."""
    from spconv import _backend
    from spconv.benchmark.launch_ledger import load_hip_cpu
    lib = load_hip_cpu()
    scope = _backend.gpu_code_on_cpu(lib.name)
    scope.__enter__()
    reader = _KernelTime(_backend.debug_library(lib))
    reader.scope = scope  # kept alive: a collected context manager would leave the route
    return reader


def main(module):
    if sys.path and os.path.abspath(sys.path[0]) == os.path.dirname(os.path.abspath(__file__)):
        sys.path.pop(0)  # never resolve the library against the files beside this script
    answers, sys.stdout = sys.stdout, sys.stderr  # what the library prints goes to stderr, not into the answers
    import numpy as np
    import torch
    torch.set_num_threads(1)
    module, _, mode = module.partition(":")
    sp = importlib.import_module(module)
    kernel_ns = _gpu_code_on_cpu() if mode == "gpu-code" else _KernelTime()
    runs = {}
    for line in sys.stdin:
        if not line.strip():
            break
        req = json.loads(line)
        key = (req["case"], req["voxels"], req["channels"])
        try:
            if key not in runs:
                feats, indices, grad = _scene(np, torch, req["voxels"], req["channels"])
                runs[key] = _case(sp, torch, req["case"], feats, indices, grad)
            fn = runs[key]
            for _ in range(req["warmup"]):
                fn()
            wall, cpu, kern = [], [], []
            for _ in range(req["calls"]):
                k0 = kernel_ns()
                c0, t0 = time.thread_time_ns(), time.perf_counter_ns()
                fn()
                t1, c1 = time.perf_counter_ns(), time.thread_time_ns()
                k = kernel_ns() - k0  # (0 but in gpu-code mode)
                kern.append(k / 1e3)
                wall.append((t1 - t0 - k) / 1e3)
                cpu.append((c1 - c0) / 1e3)  # the kernels run on the runtime's threads, not in this one
            answer = {"us": wall, "cpu_us": cpu, "kernel_us": kern}
        except Exception as e:  # the case doesn't run in this library (said in the result, not timed)
            lines = str(e).strip().splitlines()
            answer = {"error": f"{type(e).__name__}: {lines[-1][:200] if lines else ''}"}
        answer["file"] = getattr(sp, "__file__", "")
        answer["version"] = getattr(importlib.import_module(module.split(".")[0]), "__version__", "?")
        answers.write(json.dumps(answer) + "\n")
        answers.flush()


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "spconv.pytorch")
