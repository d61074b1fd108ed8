"""Plain-text tables for stdout (the JSON file carries every sample)."""
import math
from typing import Dict, List, Sequence

import torch

from spconv.benchmark.baseline import describe_peak
from spconv.benchmark.flops import weighted_ratio
from spconv.benchmark.results import Check, Measurement, Record

PASS_LABEL = {"forward": "fwd", "backward": "bwd", "forward_backward": "fwd+bwd", "build": "build"}


def fmt_num(x, digits: int = 3) -> str:
    """Aligned-friendly numbers: 3 significant-ish digits, '-' for missing."""
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    ax = abs(x)
    if ax >= 1000:
        return f"{x:,.0f}"
    if ax >= 100:
        return f"{x:.1f}"
    if ax >= 10:
        return f"{x:.2f}"
    if ax >= 0.01 or ax == 0:
        return f"{x:.{digits}f}"
    return f"{x:.1e}"


def format_table(headers: Sequence[str], rows: List[Sequence[str]], left: int = 1) -> str:
    """Columns padded to their widest cell; the first ``left`` columns left-aligned, the rest right-aligned."""
    widths = [max(len(str(h)), *(len(str(r[i])) for r in rows)) if rows else len(str(h))
              for i, h in enumerate(headers)]

    def line(cells):
        return "  ".join(str(c).ljust(w) if i < left else str(c).rjust(w)
                         for i, (c, w) in enumerate(zip(cells, widths))).rstrip()

    out = [line(headers), line(["-" * w for w in widths])]
    out += [line(r) for r in rows]
    return "\n".join(out)


def dtype_label(route: str, dtype: str) -> str:
    """The dtype column: the fused route's TF32 bodies are NVIDIA's (sm_80+); elsewhere a fused tf32 row is plain
    FP32 (the SIMT body)."""
    if dtype == "tf32" and route == "fused" and not torch.version.cuda:
        return "tf32 (fp32: no tf32 body here)"
    return dtype


def measurement_rows(ms: List[Measurement]) -> List[List[str]]:
    busy = any(m.busy_ms is not None for m in ms)
    rows = []
    for m in ms:
        route = m.route + ("*" if m.chosen else "")
        spread = f"{fmt_num(m.min_ms)}-{fmt_num(m.max_ms)}"
        mm_gflops = m.flops / (m.mm_ms * 1e6) if m.mm_ms else None
        rows.append([m.case, route, dtype_label(m.route, m.dtype), PASS_LABEL.get(m.pass_name, m.pass_name),
                     fmt_num(m.median_ms),
                     spread, str(m.iters), fmt_num(m.flops / 1e9) if m.flops else "-", fmt_num(m.gflops),
                     fmt_num(mm_gflops), fmt_num(m.mm_ratio, 2) + "x" if m.mm_ms else "-",
                     fmt_num(m.peak_fraction, 2) if m.peak_gflops else "-"]
                    + ([fmt_num(m.busy_ms), fmt_num(m.busy_ratio, 2) + "x" if m.busy_ms else "-"] if busy else []))
    return rows


MEASUREMENT_HEADERS = ["case", "route", "dtype", "pass", "median ms", "min-max ms", "n", "GFLOP", "GFLOP/s",
                       "mm GFLOP/s", "vs mm", "of peak"]
BUSY_HEADERS = ["busy ms", "busy/quiet"]  # --busy N: the same row with N CPU-bound processes beside it


def format_measurements(record: Record) -> str:
    parts = []
    for workload in _ordered({m.workload for m in record.measurements}):
        ms = [m for m in record.measurements if m.workload == workload and m.library == "this"]
        parts.append(f"== {workload}")
        peaks = sorted({(m.dtype, m.peak_gflops) for m in ms if m.peak_gflops})
        if peaks:
            parts.append("peak (best timed run, this run): " +
                         ", ".join(f"{d} {fmt_num(p)} GFLOP/s{_peak_source(record.meta, d, p)}" for d, p in peaks))
        busy = any(m.busy_ms is not None for m in ms)
        parts.append(format_table(MEASUREMENT_HEADERS + (BUSY_HEADERS if busy else []), measurement_rows(ms), left=4))
    return "\n\n".join(parts)


def _peak_source(meta: Dict[str, object], dtype: str, peak: float) -> str:
    """' = FMA loop, 2 threads (torch.mm 2048^3 202 GFLOP/s)': which measurement a dtype's peak is."""
    for key, parts in (meta.get("peak_sources") or {}).items():
        if key.endswith("/" + dtype) and parts and abs(max(parts.values()) - peak) <= 0.01:
            return " = " + describe_peak(parts)
    return ""


def _fused_rows(r: Dict[str, object], pass_key: str) -> str:
    """'1.30 / 1.14': the fused route's rows per pair of a pass, per row tile / per 16-row group."""
    tile, mma = r.get(f"fused_{pass_key}_tile"), r.get(f"fused_{pass_key}_mma")
    return "" if tile is None else f"{tile:.2f} / {mma:.2f}"


def format_layers(rows: List[Dict[str, object]]) -> str:
    table = []
    for r in rows:
        n = f"{r['n_in']:,}->{r['n_out']:,}" if "n_in" in r else ""
        table.append([r["layer"], n, f"{r['pairs']:,}" if "pairs" in r else "", fmt_num(r.get("gflop")),
                      fmt_num(r["ms"]), fmt_num(r.get("gflops")), str(r.get("fused_splits") or ""),
                      _fused_rows(r, "fwd"), _fused_rows(r, "dx")])
    text = format_table(["layer", "voxels in->out", "pairs", "GFLOP", "fwd ms", "GFLOP/s", "splits",
                         "fused fwd", "fused dinput"], table, left=1)
    if any(r.get("fused_fwd_tile") is not None for r in rows):
        ratio = {k: weighted_ratio(rows, f"fused_{k}") for k in ("fwd_tile", "fwd_mma", "dx_tile", "dx_mma")}
        text += ("\nfused fwd / dinput: the fused route's rows computed per neighbour pair on the layer's tables, per "
                 "64-row tile (gathers) / per 16-row group (multiply-adds); network, weighted by useful FLOPs: "
                 f"forward {ratio['fwd_tile']:.2f} / {ratio['fwd_mma']:.2f}, dinput {ratio['dx_tile']:.2f} / "
                 f"{ratio['dx_mma']:.2f}")
    return text


def format_checks(checks: List[Check]) -> str:
    lines = []
    for c in checks:
        status = "PASS" if c.ok else "FAIL"
        err = fmt_num(c.error) if math.isfinite(c.error) else str(c.error)
        detail = f" [{c.detail}]" if c.detail else ""
        lines.append(f"{status}  {c.workload}: {c.what}: error {err} (tol {c.tol:g}){detail}")
    return "\n".join(lines)


def format_compare(this: List[Measurement], other: List[Measurement], other_label: str) -> str:
    """Side by side per (case, dtype, pass): our time, theirs, and theirs / ours (> 1: we are faster)."""
    theirs = {(m.case, m.dtype, m.pass_name): m for m in other}
    rows = []
    for m in this:
        o = theirs.get((m.case, m.dtype, m.pass_name))
        if o is None:
            continue
        ratio = o.median_ms / m.median_ms if m.median_ms > 0 else float("nan")
        rows.append([m.case, m.dtype, PASS_LABEL.get(m.pass_name, m.pass_name), fmt_num(m.median_ms),
                     fmt_num(o.median_ms), fmt_num(m.median_ms / o.median_ms, 2) + "x",
                     fmt_num(ratio, 2) + "x"])
    missing = [k for k in theirs if k not in {(m.case, m.dtype, m.pass_name) for m in this}]
    headers = ["case", "dtype", "pass", "this ms", f"{other_label} ms", "time ratio", "speedup"]
    text = format_table(headers, rows, left=3)
    if missing:
        text += "\n(only in " + other_label + ": " + ", ".join(" ".join(k) for k in missing) + ")"
    return text


def format_header(meta: Dict[str, object]) -> str:
    lines = [f"spconv {meta.get('version')} benchmark, {meta.get('date')}",
             f"command: {meta.get('command')}",
             f"device: {meta.get('device_name')} | torch {meta.get('torch')} | threads {meta.get('threads')} | "
             f"extension backends: {meta.get('backends')}",
             f"timing: {meta.get('timing')}" + (f"; each row also timed with {meta['busy_processes']} CPU-bound "
                                               "processes beside it (busy ms, busy/quiet)"
                                               if meta.get("busy_processes") else ""),
             "route* = the route a plain model call takes here; GFLOP = useful FLOPs (2 x pairs x Cin x Cout per "
             "pass); vs mm = time of torch.mm on the same FLOPs / our time (1.0x = GEMM speed); of peak = GFLOP/s / the "
             "machine's peak measured in this run (the best of a 2048^3 torch.mm and, on a CPU, an FMA loop on the "
             "kernels' widest vectors); tf32: FP32 with TF32 allowed (the fused route's TF32 bodies on NVIDIA "
             "sm_80+, the native route's GEMMs)"]
    return "\n".join(lines)


def _ordered(names):
    order = ["basic", "large", "layers", "indices"]
    return sorted(names, key=lambda n: (order.index(n) if n in order else len(order), n))
