"""Host time of one small layer, this package against another spconv-compatible library, timed in alternation.

A SubMConv3d 3x3x3 on a few voxels and channels (40 voxels, 16 channels by default) spends its time on the host
(Python, dispatch, checks), not in arithmetic: that time is the floor of every small layer. Each library runs in
its own worker process (``layer_host_worker.py``, one thread), and the two take turns, batch by batch and in
swapped order every round, so that a busy machine slows both alike. Per case: the median of every call's wall
time and of the calling thread's CPU time (which leaves out the time the process waits for a core on a busy
machine) for each library, and the ratios this / other.

    python3 bench/layer_host_time.py --reference /path/to/python-with-spconv-2.3.8 [--gpu-code] [--out result.json]

``--gpu-code`` adds a third column, ``gpu``: this package's GPU route run on the CPU (the HIP CPU build, as the
launch ledger runs it), each call's time outside the kernels' bodies, against the same reference: the host
time a GPU layer pays before its kernels (their own work left out, ATen's small ops left in).

``--reference`` defaults to $SPCONV_REFERENCE_PYTHON.
"""
import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
WORKER = os.path.join(HERE, "layer_host_worker.py")
CASES = ["infer_cached", "infer_build", "train_cached", "train_build"]


class Worker:
    def __init__(self, python: str, env: dict, module: str, cwd: str):
        self.err = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([python, WORKER, module], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=self.err, env=env, cwd=cwd, text=True)
        self.file = self.version = None

    def run(self, **req) -> dict:
        """``{"us": [...]}`` or ``{"error": ...}``."""
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.err.seek(0)
            raise RuntimeError(f"worker {self.proc.args[0]} failed:\n{self.err.read()[-3000:]}")
        answer = json.loads(line)
        self.file, self.version = answer["file"], answer["version"]
        return answer

    def close(self):
        self.proc.stdin.write("\n")
        self.proc.stdin.flush()
        self.proc.wait(timeout=60)


def _shown_path(path, reference):
    """A path as results show it: relative to this checkout when inside it, the interpreter's environment
    folder (``reference``'s, the interpreter at ENV/bin/python) as $SPCONV_REFERENCE_ENV when it lies in it, else
    its file name: no machine's folders in the results."""
    if not path or not os.path.isabs(path):
        return path
    if path.startswith(ROOT + os.sep):
        return os.path.relpath(path, ROOT)
    env = os.path.dirname(os.path.dirname(os.path.abspath(reference)))
    if env and path.startswith(env + os.sep):
        return "$SPCONV_REFERENCE_ENV" + path[len(env):]
    return os.path.basename(path)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reference", default=os.environ.get("SPCONV_REFERENCE_PYTHON"),
                    help="interpreter importing the other library (default: $SPCONV_REFERENCE_PYTHON)")
    ap.add_argument("--voxels", type=int, default=40)
    ap.add_argument("--channels", type=int, default=16)
    ap.add_argument("--rounds", type=int, default=10, help="alternations per case")
    ap.add_argument("--calls", type=int, default=200, help="timed calls per batch")
    ap.add_argument("--warmup", type=int, default=20, help="untimed calls before each batch")
    ap.add_argument("--cases", default=",".join(CASES))
    ap.add_argument("--gpu-code", action="store_true",
                    help="also time this package's GPU route on the CPU (host time outside the kernels)")
    ap.add_argument("--out", help="write the result as JSON here")
    args = ap.parse_args(argv)
    if not args.reference:
        ap.error("--reference (or SPCONV_REFERENCE_PYTHON) is required")
    ours_env = dict(os.environ, PYTHONPATH=ROOT)
    ref_env = dict(os.environ)
    ref_env.pop("PYTHONPATH", None)
    cwd = tempfile.mkdtemp(prefix="spconv_layer_host_")
    libs = {"this": Worker(sys.executable, ours_env, "spconv.pytorch", cwd),
            "other": Worker(args.reference, ref_env, "spconv.pytorch", cwd)}
    if args.gpu_code:
        libs["gpu"] = Worker(sys.executable, ours_env, "spconv.pytorch:gpu-code", cwd)
    cases = args.cases.split(",")
    samples = {c: {lib: [] for lib in libs} for c in cases}
    cpu = {c: {lib: [] for lib in libs} for c in cases}
    errors = {c: {} for c in cases}
    try:
        for r in range(args.rounds):
            order = list(libs) if r % 2 == 0 else list(libs)[::-1]
            for case in cases:
                for lib in order:
                    if lib in errors[case]:
                        continue
                    answer = libs[lib].run(case=case, calls=args.calls, warmup=args.warmup, voxels=args.voxels,
                                           channels=args.channels)
                    if "error" in answer:
                        errors[case][lib] = answer["error"]
                    else:
                        samples[case][lib] += answer["us"]
                        cpu[case][lib] += answer["cpu_us"]
    finally:
        files = {lib: _shown_path(w.file, args.reference) for lib, w in libs.items()}
        versions = {lib: w.version for lib, w in libs.items()}
        for w in libs.values():
            w.close()
    rows = []
    print(f"SubMConv3d 3x3x3 {args.channels}->{args.channels}, {args.voxels} voxels, 1 thread; "
          f"{args.rounds} alternations x {args.calls} calls per case and library")
    print(f"{'case':14s} {'this us':>9s} {'other us':>9s} {'ratio':>6s} {'this cpu':>9s} {'other cpu':>9s} "
          f"{'ratio':>6s}   (wall, then the thread's CPU time; medians)")
    for case in cases:
        row = {"case": case, "errors": errors[case]}
        for lib, s in samples[case].items():
            if s:
                q = statistics.quantiles(s, n=4)
                row.update({f"{lib}_median_us": statistics.median(s), f"{lib}_quartiles_us": [q[0], q[2]],
                            f"{lib}_calls": len(s)})
        for lib, s in cpu[case].items():
            if s:
                row[f"{lib}_cpu_median_us"] = statistics.median(s)
        both = "this_median_us" in row and "other_median_us" in row
        row["ratio"] = row["this_median_us"] / row["other_median_us"] if both else None
        row["cpu_ratio"] = row["this_cpu_median_us"] / row["other_cpu_median_us"] if both else None
        if "gpu_median_us" in row:
            on_other = "other_median_us" in row
            row["gpu_ratio"] = row["gpu_median_us"] / row["other_median_us"] if on_other else None
            row["gpu_cpu_ratio"] = row["gpu_cpu_median_us"] / row["other_cpu_median_us"] if on_other else None
        rows.append(row)
        keys = ("this_median_us", "other_median_us", "this_cpu_median_us", "other_cpu_median_us")
        cells = [f"{row[k]:9.1f}" if k in row else f"{'-':>9s}" for k in keys]
        ratios = [f"{r:6.2f}" if r is not None else f"{'-':>6s}" for r in (row["ratio"], row["cpu_ratio"])]
        note = "; ".join(f"{lib}: {e}" for lib, e in errors[case].items())
        x = lambda r: f" ({r:.2f}x)" if r is not None else ""  # noqa: E731
        gpu = (f"   gpu route {row['gpu_median_us']:8.1f} us{x(row['gpu_ratio'])}, cpu "
               f"{row['gpu_cpu_median_us']:8.1f} us{x(row['gpu_cpu_ratio'])}" if "gpu_median_us" in row else "")
        print(f"{case:14s} {cells[0]} {cells[1]} {ratios[0]} {cells[2]} {cells[3]} {ratios[1]}{gpu} {note}")
    argv = [_shown_path(a, args.reference) for a in (sys.argv[1:] if argv is None else argv)]
    result = {"tool": "bench/layer_host_time.py", "argv": argv,
              "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "torch": torch.__version__,
              "python": platform.python_version(), "machine": platform.machine(), "cpus": os.cpu_count(),
              "voxels": args.voxels, "channels": args.channels, "rounds": args.rounds, "calls": args.calls,
              "warmup": args.warmup, "files": files, "versions": versions, "cases": rows}
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(result, fh, indent=1)
    return result


if __name__ == "__main__":
    main()
