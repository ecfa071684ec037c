"""TTFT and throughput against offered load, one line per routing contender (PNG)."""

from __future__ import annotations

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
    for label, rows in by_label.items():
        xs = [x_of(s) for s in rows]
        axes[0].plot(xs, [s.ttft_p50_s for s in rows], marker="o", label=label)
        axes[1].plot(xs, [s.ttft_p90_s for s in rows], marker="o", label=label)
        axes[2].plot(xs, [s.throughput_tok_s for s in rows], marker="o", label=label)
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
