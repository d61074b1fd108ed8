"""What a benchmark run produces: timed measurements, correctness checks, notes; JSON-ready."""
import math
from dataclasses import asdict, dataclass, field
from typing import Dict, List, Optional


@dataclass
class Measurement:
    """One timed (workload, case, route, dtype, pass)."""

    workload: str
    case: str
    route: str
    chosen: bool  # the route a plain model call takes on this device
    dtype: str
    pass_name: str  # forward | backward | forward_backward
    voxels: int
    flops: int
    median_ms: float
    min_ms: float
    max_ms: float
    iters: int
    mm_ms: Optional[float] = None  # torch.mm on the same useful FLOPs, same run
    peak_gflops: Optional[float] = None  # the machine's peak for this dtype, same run (baseline.peak_gflops)
    busy_ms: Optional[float] = None  # median with --busy N CPU-bound processes beside it, same run
    samples_ms: List[float] = field(default_factory=list)
    busy_samples_ms: List[float] = field(default_factory=list)  # the busy pass's timed iterations
    library: str = "this"  # "this" or the compared implementation's label

    @property
    def gflops(self) -> float:
        return self.flops / (self.median_ms * 1e6) if self.median_ms > 0 and self.flops else float("nan")

    @property
    def mm_ratio(self) -> float:
        """Achieved GFLOP/s over torch.mm's on the same FLOPs (time_mm / time_ours)."""
        if self.mm_ms is None or not self.median_ms > 0 or not self.flops:
            return float("nan")
        return self.mm_ms / self.median_ms

    @property
    def busy_ratio(self) -> float:
        """Median time under the busy load over the quiet median."""
        return self.busy_ms / self.median_ms if self.busy_ms is not None and self.median_ms > 0 else float("nan")

    @property
    def peak_fraction(self) -> float:
        """Achieved useful GFLOP/s over the machine's big-GEMM rate."""
        return self.gflops / self.peak_gflops if self.peak_gflops else float("nan")

    def to_dict(self) -> Dict[str, object]:
        d = asdict(self)
        d["gflops"] = _finite(self.gflops)
        d["mm_ratio"] = _finite(self.mm_ratio)
        d["peak_fraction"] = _finite(self.peak_fraction)
        d["busy_ratio"] = _finite(self.busy_ratio)
        return d


@dataclass
class Check:
    """One correctness line: max |got - ref| / max |ref| against a tolerance."""

    workload: str
    what: str
    error: float
    tol: float
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.error <= self.tol  # NaN fails

    def to_dict(self) -> Dict[str, object]:
        return {"workload": self.workload, "what": self.what, "error": _finite(self.error), "tol": self.tol,
                "ok": self.ok, "detail": self.detail}


@dataclass
class Record:
    """Everything one run measured, plus what it skipped and why."""

    meta: Dict[str, object] = field(default_factory=dict)
    measurements: List[Measurement] = field(default_factory=list)
    checks: List[Check] = field(default_factory=list)
    layers: Dict[str, List[Dict[str, object]]] = field(default_factory=dict)  # per-layer breakdowns
    notes: List[str] = field(default_factory=list)
    ledger: Dict[str, object] = field(default_factory=dict)  # the launch ledger (workloads/ledger.py), when run
    ledger_table: str = ""

    @property
    def all_ok(self) -> bool:
        return all(c.ok for c in self.checks)

    def to_dict(self) -> Dict[str, object]:
        d = {"meta": self.meta, "measurements": [m.to_dict() for m in self.measurements],
             "checks": [c.to_dict() for c in self.checks], "layers": self.layers, "notes": self.notes,
             "all_checks_passed": self.all_ok}
        if self.ledger:
            d["ledger"] = self.ledger
        return d


def _finite(x: float) -> Optional[float]:
    return x if isinstance(x, (int, float)) and math.isfinite(x) else None
