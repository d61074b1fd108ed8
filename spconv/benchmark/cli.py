"""``python -m spconv.benchmark``: argument parsing and the order things run in."""
import argparse
import datetime
import json
import os
import platform
import shlex
import sys
import time
import traceback
from typing import List, Optional

import torch

import spconv
from spconv.benchmark import baseline, compare, report
from spconv.benchmark.plot import save_plot
from spconv.benchmark.progress import iterate
from spconv.benchmark.results import Check, Record
from spconv.benchmark.routes import chosen_route_name
from spconv.benchmark.timing import Plan, busy_load, default_plan
from spconv.benchmark.workloads import backbone, basic, indices, layers, ledger
from spconv.benchmark.workloads.common import DTYPES, Context

# Settings read from the environment that change which code runs or how fast (recorded in the command line).
ENV_VARS = ("SPCONV_FORCE_NATIVE", "SPCONV_CPU_ISA", "SPCONV_FUSED_CPU_GEMM", "MKL_ENABLE_INSTRUCTIONS",
            "THP_MEM_ALLOC_ENABLE", "OMP_NUM_THREADS", "OMP_WAIT_POLICY", "GOMP_SPINCOUNT")

WORKLOADS = ("basic", "large", "layers", "indices", "backbone", "ledger")


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m spconv.benchmark", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="small scan and sweep (a smoke run, seconds)")
    p.add_argument("--full", action="store_true", help="everything: large, 1e6-voxel layers, all dtypes, all routes")
    p.add_argument("--workloads", default=None,
                   help=f"comma list of {','.join(WORKLOADS)} (default: basic,layers,indices,backbone; --full and --points "
                        "add large). ledger: kernel launches, host waits and allocations of the GPU code per module, "
                        "counted on the HIP CPU build (any machine; needs a source checkout)")
    p.add_argument("--data", metavar="FILE.npz", help="voxelized scan for basic: features, indices, spatial_shape")
    p.add_argument("--points", metavar="FILE.npz", help="raw sweep (pc [N, 3]) for large: stacked x8, voxelized")
    p.add_argument("--device", default=None, help="cpu or cuda[:N] (default: cuda when available)")
    p.add_argument("--dtypes", default=None, help="comma list of fp32,tf32,fp16,bf16 (default: fp32 on CPU; "
                                                  "fp32,fp16 on GPU, plus tf32 on NVIDIA)")
    p.add_argument("--warmup", type=int, default=None, help="untimed iterations per measurement")
    p.add_argument("--iters", type=int, default=None, help="timed iterations per measurement")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--cpu-route", action="store_true", help="on a GPU machine, time the host route too")
    p.add_argument("--compare", metavar="TARGET",
                   help="another spconv-compatible implementation, run on the basic workload in a subprocess: "
                        "a python interpreter, an environment folder, a PYTHONPATH folder or a module name")
    p.add_argument("--compare-module", default=None, help="module used in place of spconv.pytorch by --compare")
    p.add_argument("--json", metavar="FILE", help="write every measurement, sample and check as JSON")
    p.add_argument("--plot", metavar="FILE.png", help="draw per-layer times and throughput (needs matplotlib)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--busy", type=int, default=0, metavar="N",
                   help="also time every row with N CPU-bound processes running beside it (busy/quiet column)")
    return p.parse_args(argv)


def pick_dtypes(args, device: torch.device) -> List[str]:
    if args.dtypes:
        names = [d.strip() for d in args.dtypes.split(",") if d.strip()]
        bad = [d for d in names if d not in DTYPES]
        if bad:
            raise SystemExit(f"--dtypes: unknown {bad}; choose from {sorted(DTYPES)}")
        return names
    if device.type == "cpu":
        return ["fp32", "bf16", "fp16"] if args.full else ["fp32"]
    names = ["fp32"] + (["tf32"] if torch.version.cuda else []) + ["fp16"]
    return names + ["bf16"] if args.full else names


def pick_workloads(args) -> List[str]:
    if args.workloads:
        names = [w.strip() for w in args.workloads.split(",") if w.strip()]
        bad = [w for w in names if w not in WORKLOADS]
        if bad:
            raise SystemExit(f"--workloads: unknown {bad}; choose from {list(WORKLOADS)}")
        return names
    names = ["basic", "layers", "indices", "backbone"]
    if args.full or args.points:
        names.insert(1, "large")
    return names


def device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as fh:
            model = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), model)
    except OSError:
        pass
    return f"CPU {model} ({os.cpu_count()} logical cores)"


def run_tasks(tasks, args, record, seconds):
    """The tasks in order under the progress bar, each one's time in ``seconds``."""
    for task in iterate(tasks, enabled=not args.no_progress, notes=record.notes):
        t0 = time.perf_counter()
        try:
            task.run()
        except Exception as e:  # one broken case must not hide the others: it becomes a FAIL line
            traceback.print_exc(file=sys.stderr)
            first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
            record.checks.append(Check(task.label.split()[0], f"{task.label} runs", float("inf"), 0.0,
                                       f"{type(e).__name__}: {first}"))
        seconds[task.label] = round(time.perf_counter() - t0, 2)


def main(argv: Optional[List[str]] = None) -> int:
    args = parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = torch.device(args.device or ("cuda" if torch.cuda.is_available() else "cpu"))
    plan = default_plan(device, args.quick)
    plan = Plan(plan.warmup if args.warmup is None else args.warmup, plan.iters if args.iters is None else args.iters)
    record = Record()
    info = spconv.build_info()
    # The environment variables that change what runs, written before the command as a shell would take them.
    env = " ".join(f"{k}={shlex.quote(os.environ[k])}" for k in ENV_VARS if os.environ.get(k))
    record.meta = {
        "version": spconv.__version__, "date": datetime.datetime.now(datetime.timezone.utc).strftime(
            "%Y-%m-%d %H:%M UTC"), "command": (env + " " if env else "") + "python -m spconv.benchmark "
        + shlex.join(sys.argv[1:] if argv is None else argv),
        "device": str(device), "device_name": device_name(device), "torch": torch.__version__,
        "threads": torch.get_num_threads(), "backends": ",".join(info.get("backends", [])),
        "chosen_route": chosen_route_name(device),
        "timing": (f"{'CUDA events' if device.type == 'cuda' else 'host clock'}, {plan.describe()} per "
                   f"measurement; median and min-max"
                   + ("" if device.type == "cuda" else
                      f"; torch.mm timed on <= {baseline.CPU_ROW_CAP} rows per product, scaled linearly")),
    }
    ctx = Context(device=device, dtypes=pick_dtypes(args, device), plan=plan, record=record, quick=args.quick,
                  full=args.full, with_cpu_route=args.cpu_route or (args.full and device.type == "cuda"),
                  data=args.data, points=args.points, seed=args.seed)
    workloads = pick_workloads(args)
    tasks = []
    for w in workloads:
        tasks += {"basic": lambda: basic.tasks(ctx, "basic"), "large": lambda: basic.tasks(ctx, "large"),
                  "layers": lambda: layers.tasks(ctx), "indices": lambda: indices.tasks(ctx),
                  "backbone": lambda: backbone.tasks(ctx), "ledger": lambda: ledger.tasks(ctx)}[w]()
    if args.compare and "basic" not in workloads:
        raise SystemExit("--compare runs the basic workload: include it in --workloads")
    if args.busy:
        record.meta["busy_processes"] = args.busy
    print(report.format_header(record.meta), flush=True)
    seconds = record.meta.setdefault("task_seconds", {})
    with busy_load(args.busy):
        run_tasks(tasks, args, record, seconds)
    note_parallel_regions(record, device)
    compare_label = None
    if args.compare:
        target = compare.resolve_target(args.compare, args.compare_module)
        scan = basic.basic_scan(ctx.data, ctx.quick, ctx.seed)
        net = basic.build_net(torch.device("cpu"), torch.float32, ctx.seed)
        dtypes = [d for d in ctx.dtypes if d != "tf32"]
        try:
            compare_label = compare.compare_basic(record, target, scan, net, dtypes, device, plan)
        except (RuntimeError, OSError, subprocess_timeout()) as e:
            record.notes.append(f"--compare {args.compare}: {e}")
    print_report(record, compare_label)
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(record.to_dict(), fh, indent=1)
        print(f"wrote {args.json}")
    if args.plot:
        why = save_plot(record, args.plot)
        print(why or f"wrote {args.plot}")
    return 0 if record.all_ok else 1


def note_parallel_regions(record: Record, device: torch.device) -> None:
    """How the native route's parallel regions ran in this process (csrc/native/region_stalls.h): on a busy
    machine, regions that waited on a late thread and regions that then started on the caller alone."""
    if device.type != "cpu":
        return
    closed, waited, alone, finished, _ = torch.ops.spconv_debug.cpu_parallel_region_info()
    record.meta["cpu_parallel_regions"] = {"closed": closed, "waited_on_late_thread": waited,
                                           "started_on_caller": alone, "finished_on_caller": finished}
    record.notes.append(f"native CPU parallel regions this run: {closed} closed, {waited} of them waited on a late "
                        f"thread; {alone} started on the caller alone after such waits, {finished} of them "
                        f"finished there")


def subprocess_timeout():
    import subprocess
    return subprocess.TimeoutExpired


def print_report(record: Record, compare_label: Optional[str]):
    print()
    print(report.format_measurements(record))
    for key, rows in list(record.layers.items())[:1]:  # the chosen route's first dtype; --json has every one
        print(f"\n== per layer, forward: {key}")
        print(report.format_layers(rows))
    if compare_label:
        ours = [m for m in record.measurements if m.workload == "basic" and m.chosen and m.library == "this"]
        theirs = [m for m in record.measurements if m.library == compare_label]
        print(f"\n== compare: basic, this vs {compare_label} ({record.meta['compare']['target']})")
        print(report.format_compare(ours, theirs, compare_label))
    if record.ledger_table:
        print(f"\n== launch ledger: {record.ledger['input']} ({record.ledger['library']})")
        print(record.ledger_table)
    print("\n== correctness")
    print(report.format_checks(record.checks))
    if record.notes:
        print("\n== notes")
        print("\n".join(f"- {n}" for n in record.notes))
    failed = [c for c in record.checks if not c.ok]
    print(f"\n{len(record.checks) - len(failed)} of {len(record.checks)} correctness checks passed"
          + (f"; FAILED: {len(failed)}" if failed else ""))
