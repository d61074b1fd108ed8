"""``--compare TARGET``: the ``basic`` network run by another spconv-compatible implementation in a subprocess,
on the same input and the same weights, side by side with this run.

TARGET is one of:
  * a Python interpreter (``/path/to/env/bin/python``) or an environment folder holding ``bin/python`` (a venv,
    a conda env): the other implementation is whatever ``spconv.pytorch`` that environment imports;
  * a folder to put on PYTHONPATH for this interpreter (a source checkout or a ``pip install --target`` folder);
  * a module name importable here, used in place of ``spconv.pytorch`` (``--compare-module`` sets the module for
    the other two forms).
"""
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from typing import Dict, List, Optional

import numpy as np
import torch

import spconv.pytorch as sp
from spconv.benchmark import reference
from spconv.benchmark.results import Check, Measurement, Record
from spconv.benchmark.timing import Stats
from spconv.benchmark.workloads.common import DTYPES, sparse_tensor

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "compare_worker.py")


@dataclass
class Target:
    python: str
    module: str
    env: Dict[str, str]
    describe: str


def resolve_target(target: str, module: Optional[str] = None, environ=None) -> Target:
    env = dict(os.environ if environ is None else environ)
    module = module or "spconv.pytorch"
    venv_python = [os.path.join(target, "bin", "python"), os.path.join(target, "Scripts", "python.exe")]
    if os.path.isfile(target) and os.access(target, os.X_OK):
        env.pop("PYTHONPATH", None)  # the other interpreter's own packages, not this checkout's
        return Target(target, module, env, f"interpreter {target}")
    if os.path.isdir(target):
        for py in venv_python:
            if os.path.isfile(py):
                env.pop("PYTHONPATH", None)
                return Target(py, module, env, f"environment {target}")
        env["PYTHONPATH"] = os.path.abspath(target)
        return Target(sys.executable, module, env, f"PYTHONPATH={target}")
    if os.sep in target or target.startswith("."):
        raise ValueError(f"--compare {target!r}: no such interpreter or folder")
    return Target(sys.executable, target, env, f"module {target}")


def run_compare(target: Target, scan, net_state: Dict[str, torch.Tensor], dtypes: List[str], device: torch.device,
                warmup: int, iters: int, backward: bool = True, timeout_s: float = 3600.0):
    """Runs the worker; returns (result dict, {dtype: output npz path}). Raises RuntimeError with its stderr."""
    job_dir = tempfile.mkdtemp(prefix="spconv_bench_compare_")
    arrays = {"features": scan.features, "indices": scan.indices, "spatial_shape": np.asarray(scan.shape)}
    arrays.update({f"w:{k}": v.detach().float().cpu().numpy() for k, v in net_state.items()})
    np.savez(os.path.join(job_dir, "input.npz"), **arrays)
    job = {"module": target.module, "device": str(device), "dtypes": dtypes, "warmup": warmup, "iters": iters,
           "threads": torch.get_num_threads(), "backward": backward}
    result = run_worker(target, WORKER, job_dir, job, timeout_s)
    outputs = {d: os.path.join(job_dir, f"output_{d}.npz") for d in dtypes}
    return result, outputs


def run_worker(target: Target, worker: str, job_dir: str, job: Dict, timeout_s: float = 3600.0) -> Dict:
    """Runs ``worker JOB_DIR`` under the target's interpreter (cwd JOB_DIR, so nothing of this checkout is on its
    path) after writing ``job`` to JOB_DIR/job.json; returns the JSON the worker wrote to JOB_DIR/result.json.
    Raises RuntimeError with the worker's stderr when it fails. The tests' reference workers use it too."""
    with open(os.path.join(job_dir, "job.json"), "w") as fh:
        json.dump(job, fh)
    proc = subprocess.run([target.python, worker, job_dir], env=target.env, cwd=job_dir, capture_output=True,
                          text=True, timeout=timeout_s)
    result_path = os.path.join(job_dir, "result.json")
    if proc.returncode != 0 or not os.path.exists(result_path):
        raise RuntimeError(f"worker {os.path.basename(worker)} failed ({target.describe}, exit {proc.returncode}):\n"
                           f"{proc.stderr.strip()[-3000:]}")
    with open(result_path) as fh:
        return json.load(fh)


def other_measurements(result: Dict, ours: List[Measurement], label: str) -> List[Measurement]:
    """The other library's times as Measurements keyed like ours (same case, FLOPs: the work is identical)."""
    by_key = {(m.dtype, m.pass_name): m for m in ours}
    out = []
    for run in result["runs"]:
        for pass_name, samples in run["times"].items():
            mine = by_key.get((run["dtype"], pass_name))
            if mine is None:
                continue
            st = Stats(samples)
            out.append(Measurement(workload=mine.workload, case=mine.case, route="-", chosen=False,
                                   dtype=run["dtype"], pass_name=pass_name, voxels=mine.voxels, flops=mine.flops,
                                   median_ms=st.median, min_ms=st.min, max_ms=st.max, iters=len(samples),
                                   samples_ms=samples, library=label))
    return out


def gemm_floor_notes(ours: List[Measurement], theirs: List[Measurement], label: str) -> List[str]:
    """How fast any implementation could be here: the network's useful FLOPs at torch.mm's speed on the same
    products (measured in this run), as a fraction of the other library's time."""
    mine = {(m.dtype, m.pass_name): m for m in ours}
    notes = []
    for t in theirs:
        m = mine.get((t.dtype, t.pass_name))
        if t.pass_name != "forward" or m is None or m.mm_ms is None or not t.median_ms > 0:
            continue
        notes.append(f"GEMM floor, basic {t.dtype} forward: its {m.flops / 1e9:.4g} useful GFLOP at torch.mm's speed "
                     f"take {m.mm_ms:,.4g} ms here = {m.mm_ms / t.median_ms:.2f}x {label}'s time "
                     f"(this run: {m.median_ms / t.median_ms:.2f}x)")
    return notes


def output_check(workload: str, label: str, dtype_name: str, ours, theirs_npz: str) -> Check:
    """Final outputs compared through their dense form (pooled outputs have no promised row order)."""
    if not os.path.exists(theirs_npz):
        return Check(workload, f"{dtype_name} output vs {label}", float("nan"), 0.0, "no output from the other run")
    with np.load(theirs_npz) as d:
        shape = [1] + [int(s) for s in d["spatial_shape"]] + [d["features"].shape[1]]
        theirs = dense_from(d["features"], d["indices"], shape)
    mine = dense_from(ours.features.float().cpu().numpy(), ours.indices.cpu().numpy(),
                      [1] + list(ours.spatial_shape) + [ours.features.shape[1]])
    tol = reference.TOLERANCE[DTYPES[dtype_name]]
    err = reference.rel_error(torch.from_numpy(mine), torch.from_numpy(theirs))
    return Check(workload, f"{dtype_name} output vs {label} (whole network)", err, tol,
                 f"{ours.indices.shape[0]} output voxels")


def dense_from(features: np.ndarray, indices: np.ndarray, shape) -> np.ndarray:
    out = np.zeros(shape, np.float64)
    if len(indices):
        out[tuple(indices.astype(np.int64).T)] = features
    return out


def compare_basic(record: Record, target: Target, scan, net, dtypes: List[str], device: torch.device, plan,
                  backward: bool = True) -> str:
    """Runs the comparison and adds its measurements, checks and notes to ``record``; returns the label."""
    result, outputs = run_compare(target, scan, net.state_dict(), dtypes, device, plan.warmup, plan.iters,
                                  backward)
    label = result["library"]
    ours = [m for m in record.measurements if m.workload == "basic" and m.chosen and m.library == "this"]
    theirs = other_measurements(result, ours, label)
    record.measurements += theirs
    record.notes += gemm_floor_notes(ours, theirs, label)
    record.meta["compare"] = {"target": target.describe, "library": label, "module_file": result["module_file"],
                              "torch": result["torch"], "threads": result["threads"]}
    for run in result["runs"]:
        for pass_name, err in run["errors"].items():
            record.notes.append(f"{label} {run['dtype']} {pass_name}: not available ({err})")
    with torch.no_grad():
        for dtype_name in dtypes:
            dtype = DTYPES[dtype_name]
            y = net.to(device, dtype)(sparse_tensor(sp, scan.features, scan.indices, scan.shape, device, dtype))
            record.checks.append(output_check("basic", label, dtype_name, y, outputs[dtype_name]))
            note = threaded_output_note(label, dtype_name, outputs[dtype_name], result["threads"])
            if note:
                record.notes.append(note)
    return label


def threaded_output_note(label: str, dtype_name: str, single_npz: str, threads: int) -> Optional[str]:
    """The other library's output is checked from a single-threaded run; says when its output at the timed
    thread count differs from it (spconv 2.3.8's CPU scatter_add_cpu races under more than one torch thread)."""
    threaded_npz = single_npz[:-len(".npz")] + "_threaded.npz"
    if threads <= 1 or not (os.path.exists(single_npz) and os.path.exists(threaded_npz)):
        return None
    dense = []
    for path in (single_npz, threaded_npz):
        with np.load(path) as d:
            dense.append(dense_from(d["features"], d["indices"],
                                    [1] + [int(s) for s in d["spatial_shape"]] + [d["features"].shape[1]]))
    if dense[0].shape != dense[1].shape:
        return f"{label} {dtype_name}: output at {threads} threads has another shape than at 1 thread"
    err = reference.rel_error(torch.from_numpy(dense[1]), torch.from_numpy(dense[0]))
    if err <= reference.TOLERANCE[DTYPES[dtype_name]]:
        return None
    return (f"{label} {dtype_name}: output at {threads} threads differs from its 1-thread output by {err:.2g} "
            f"(nondeterministic there); checked against the 1-thread output, timed at {threads} threads")
