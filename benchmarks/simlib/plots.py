"""TTFT and throughput against offered load, one line per routing contender (PNG)."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from benchmarks.simlib.report import Summary  # noqa: E402


def plot_ladder(by_label: dict[str, list[Summary]], title: str, path: Path,
                saturation_qps: float | None = None) -> Path:
    """Three panels: TTFT p50 and p90 (log scale) and output throughput, against QPS.
    Rates are the offered rates; an all-at-once point is drawn at the right edge."""
    finite = [s.rate_qps for rows in by_label.values() for s in rows
              if s.rate_qps != float("inf")]
    edge = max(finite) * 1.25 if finite else 1.0

    def x_of(s: Summary) -> float:
        return edge if s.rate_qps == float("inf") else s.rate_qps

    fig, axes = plt.subplots(1, 3, figsize=(15, 4.2))
    styles = [("o", "-"), ("s", "-"), ("x", "--"), ("^", ":"), ("v", ":"), ("D", "-."),
              ("+", "-.")]  # overlapping lines stay visible
    for k, (label, rows) in enumerate(by_label.items()):
        xs = [x_of(s) for s in rows]
        marker, line = styles[k % len(styles)]
        for ax, ys in zip(axes, ([s.ttft_p50_s for s in rows], [s.ttft_p90_s for s in rows],
                                 [s.throughput_tok_s for s in rows])):
            ax.plot(xs, ys, marker=marker, linestyle=line, label=label)
    for ax, name in zip(axes, ("TTFT p50 (s)", "TTFT p90 (s)", "output tokens/s")):
        ax.set_xlabel("offered load (req/s)" + (" ; right edge: all at once"
                                                if edge in [x_of(s) for rows in
                                                            by_label.values() for s in rows]
                                                else ""))
        ax.set_ylabel(name)
        ax.grid(True, alpha=0.3)
        if saturation_qps is not None:
            ax.axvline(saturation_qps, color="grey", linestyle="--", linewidth=1)
    axes[0].set_yscale("log")
    axes[1].set_yscale("log")
    axes[0].legend(fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def replot(dump_path: Path) -> Path:
    """Redraws a ladder's PNG (next to it) from the JSON that sim_routing wrote with it."""
    dump = json.loads(dump_path.read_text())
    by_label = {label: [Summary(**{"cpu_s": float("nan"), **row}) for row in rows]
                for label, rows in dump["runs"].items()}  # cpu_s: absent from older dumps
    a = dump["args"]
    title = (f"{a['workload']}: {a['replicas']} replicas x {dump['result']['num_blocks']} "
             f"blocks, {a['preset']}")
    return plot_ladder(by_label, title, dump_path.with_suffix(".png"),
                       dump["result"].get("saturation_rate_qps"))
