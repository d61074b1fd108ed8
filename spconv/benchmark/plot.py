"""``--plot FILE.png``: per-layer forward times of the basic network and throughput of the layer sweep."""
from typing import Optional

from spconv.benchmark.results import Record


def save_plot(record: Record, path: str) -> Optional[str]:
    """Writes the figure; returns a note saying why nothing was drawn, or None."""
    try:
        import matplotlib
        matplotlib.use("Agg")  # files only, no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return f"skipped --plot {path}: matplotlib is not installed (pip install 'spconv-hip[bench]')"
    fig, (ax_layers, ax_sweep) = plt.subplots(1, 2, figsize=(14, 5.5))
    _plot_layers(ax_layers, record)
    _plot_sweep(ax_sweep, record)
    fig.suptitle(f"spconv {record.meta.get('version')} on {record.meta.get('device_name')}, "
                 f"{record.meta.get('date')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None


def _plot_layers(ax, record: Record):
    key = next((k for k in record.layers if k.startswith("basic")), None)
    if key is None:
        ax.set_title("basic: not run")
        return
    rows = record.layers[key]
    names = [r["layer"].split(":", 1)[0] + ":" + ("pool" if "Pool" in r["layer"] else
                                                  f"{r.get('cin', '')}->{r.get('cout', '')}") for r in rows]
    ax.bar(range(len(rows)), [r["ms"] for r in rows], color=["tab:orange" if "Pool" in r["layer"] else "tab:blue"
                                                              for r in rows])
    ax.set_xticks(range(len(rows)), names, rotation=60, fontsize=7)
    ax.set_ylabel("forward ms (median)")
    ax.set_title(f"basic, per layer ({key})", fontsize=9)
    twin = ax.twinx()
    conv = [(i, r["gflops"]) for i, r in enumerate(rows) if r.get("gflops")]
    if conv:
        twin.plot(*zip(*conv), "k.-", label="GFLOP/s")
        twin.set_ylabel("GFLOP/s")


def _plot_sweep(ax, record: Record):
    ms = [m for m in record.measurements if m.workload == "layers" and m.library == "this"
          and m.pass_name == "forward" and m.case.endswith(" cached") and m.chosen]
    if not ms:
        ax.set_title("layers: not run")
        return
    labels = [f"{m.case.replace(' cached', '')} {m.dtype}" for m in ms]
    x = range(len(ms))
    ax.bar([i - 0.2 for i in x], [m.gflops for m in ms], width=0.4, label="sparse conv (cached map)")
    ax.bar([i + 0.2 for i in x], [m.flops / (m.mm_ms * 1e6) if m.mm_ms else 0 for m in ms], width=0.4,
           label="torch.mm, same FLOPs")
    ax.set_xticks(list(x), labels, rotation=60, fontsize=7, ha="right")
    ax.set_ylabel("GFLOP/s (forward)")
    ax.set_title("layers: throughput vs torch.mm", fontsize=9)
    ax.legend(fontsize=8)
