"""Renders the panels of dashboards/kvroute.json to PNG (one image per dashboard row) from a
real Prometheus, with matplotlib, the way Grafana would draw them.

By default it brings up the live stack itself: `kvroute serve --engine sim`, a Prometheus
scraping it every second, and a shared-prefix load whose prefix set changes every few rounds
(hit rates dip, then recover). Or it renders a window of an existing Prometheus.

    .venv/bin/python -m dashboards.render                       # live stack, docs/dashboard/
    .venv/bin/python -m dashboards.render --prometheus-url http://prom:9090 \\
        --start-s 1767000000 --end-s 1767003600 --rate-interval 5m
"""

from __future__ import annotations

import argparse
import math
import re
import sys
import tempfile
import time
from pathlib import Path

from matplotlib.figure import Figure

from dashboards.live import (
    REPO,
    KvrouteSim,
    Prometheus,
    PrometheusAPI,
    send_completions,
    shared_prefix_prompts,
)
from dashboards.panels import load_dashboard, substitute

# Grafana unit -> (scale, axis label).
UNITS = {"percentunit": (100.0, "%"), "s": (1000.0, "ms"), "reqps": (1.0, "requests/s"),
         "ops": (1.0, "per second"), "short": (1.0, "")}
MAX_STEPS = 600  # points per series, like Grafana's max data points


def legend(legend_format: str, labels: dict) -> str:
    return re.sub(r"\{\{\s*(\w+)\s*\}\}", lambda m: labels.get(m.group(1), ""), legend_format)


def dashboard_rows(dashboard: dict) -> list[tuple[str, list[dict]]]:
    rows: list[tuple[str, list[dict]]] = []
    for panel in dashboard["panels"]:
        if panel["type"] == "row":
            rows.append((panel["title"], list(panel.get("panels", []))))
        else:
            rows[-1][1].append(panel)
    return rows


def draw_panel(ax, panel: dict, prometheus: PrometheusAPI, variables: dict, start_s: float,
               end_s: float, step_s: float) -> list[str]:
    """Draws one panel; returns 'legend: last value' lines of what it drew."""
    unit = panel["fieldConfig"]["defaults"]["unit"]
    scale, axis_label = UNITS[unit]
    # A bar gauge (the miss-ratio curve) has no stacking: drawn as lines over time here
    stacked = panel["fieldConfig"]["defaults"].get("custom", {}).get(
        "stacking", {}).get("mode") == "normal"
    drawn, summary = [], []  # drawn: (legend, {minute: scaled value})
    for target in panel["targets"]:
        for labels, times_s, values in prometheus.query_range(
                substitute(target["expr"], variables), start_s, end_s, step_s):
            name = legend(target.get("legendFormat", ""), labels) or target["refId"]
            drawn.append((name, {(t - start_s) / 60.0: v * scale
                                 for t, v in zip(times_s, values)}))
            finite = [v for v in values if math.isfinite(v)]
            if finite:
                summary.append(f"{name}: {finite[-1] * scale:.4g} {axis_label}".rstrip())
    if stacked and drawn:
        # Range results share the start + k * step grid; a missing or NaN point stacks as 0.
        minutes = sorted({m for _, points in drawn for m in points})
        ax.stackplot(minutes, *[[v if math.isfinite(v := points.get(m, 0.0)) else 0.0
                                 for m in minutes] for _, points in drawn],
                     labels=[name for name, _ in drawn], alpha=0.7)
    else:
        for name, points in drawn:
            ax.plot(list(points), list(points.values()), label=name, linewidth=1.2)
    defaults = panel["fieldConfig"]["defaults"]
    if "min" in defaults and "max" in defaults:
        margin = 0.03 * (defaults["max"] - defaults["min"]) * scale  # keep lines at the edge
        ax.set_ylim(defaults["min"] * scale - margin, defaults["max"] * scale + margin)
    ax.set_title(panel["title"], fontsize=10)
    ax.set_xlabel("minutes")
    ax.set_ylabel(axis_label)
    ax.grid(alpha=0.3)
    if drawn:
        ax.legend(fontsize=7, loc="best")
    else:
        ax.text(0.5, 0.5, "no data", ha="center", va="center", transform=ax.transAxes)
    return summary


def render(prometheus: PrometheusAPI, out_dir: Path, start_s: float, end_s: float,
           variables: dict) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    step_s = max(1.0, (end_s - start_s) / MAX_STEPS)
    paths = []
    for title, panels in dashboard_rows(load_dashboard()):
        num_cols = 3
        num_rows = -(-len(panels) // num_cols)
        fig = Figure(figsize=(6 * num_cols, 3.6 * num_rows))
        axes = fig.subplots(num_rows, num_cols, squeeze=False)
        for ax, panel in zip(axes.flat, panels):
            for line in draw_panel(ax, panel, prometheus, variables, start_s, end_s, step_s):
                print(f"{title} / {panel['title']} / {line}")
        for ax in list(axes.flat)[len(panels):]:
            ax.axis("off")
        fig.suptitle(f"kvroute: {title}", fontsize=13)
        fig.tight_layout()
        path = out_dir / f"{re.sub(r'[^a-z]+', '-', title.lower()).strip('-')}.png"
        fig.savefig(path, dpi=90)
        paths.append(path)
    return paths


def drive_rounds(server: KvrouteSim, prometheus: Prometheus, duration_s: float) -> int:
    """Shared-prefix rounds until `duration_s` has passed. The prefix set changes every 8
    rounds and comes back after three sets, by then evicted from the small device pool to
    the host tier."""
    num_sent, round_index = 0, 0
    deadline = time.monotonic() + duration_s
    while time.monotonic() < deadline:
        prompts = [f"{prompt} (round {round_index})"
                   for prompt in shared_prefix_prompts(6, 4, seed=(round_index // 8) % 3)]
        num_sent += send_completions(server.url, prompts, concurrency=4)
        round_index += 1
    prometheus.wait_for_requests(num_sent)
    return num_sent


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=REPO / "docs" / "dashboard")
    parser.add_argument("--prometheus-url", help="render from this Prometheus instead")
    parser.add_argument("--start-s", type=float, help="window start (unix s), with the URL")
    parser.add_argument("--end-s", type=float, help="window end (unix s), with the URL")
    parser.add_argument("--rate-interval", default="15s", help="value of $__rate_interval")
    parser.add_argument("--model", default=".*", help="value of $model (a regex)")
    parser.add_argument("--replica", default=".*", help="value of $replica (a regex)")
    parser.add_argument("--duration-s", type=float, default=90.0, help="live load duration")
    parser.add_argument("--replicas", type=int, default=2, help="live engine replicas")
    parser.add_argument("--num-blocks", type=int, default=256,
                        help="live device KV blocks per replica (small: evictions show)")
    parser.add_argument("--num-host-blocks", type=int, default=4096,
                        help="live host-tier KV blocks per replica")
    parser.add_argument("--pooled-sample-rate", type=float, default=1.0,
                        help="live R of the pooled bound (a short load holds few blocks: "
                             "sample them all)")
    parser.add_argument("--kvroute-bin", default=str(Path(sys.executable).with_name("kvroute")))
    parser.add_argument("--prometheus-bin", default="prometheus")
    args = parser.parse_args(argv)
    variables = {"model": args.model, "replica": args.replica,
                 "__rate_interval": args.rate_interval}

    if args.prometheus_url:
        if args.start_s is None or args.end_s is None:
            parser.error("--prometheus-url needs --start-s and --end-s")
        api = PrometheusAPI(args.prometheus_url)
        try:
            paths = render(api, args.out, args.start_s, args.end_s, variables)
        finally:
            api.close()
    else:
        workdir = Path(tempfile.mkdtemp(prefix="kvroute-render-"))
        server = KvrouteSim(args.kvroute_bin, workdir, num_replicas=args.replicas,
                            extra_args=("--num-blocks", str(args.num_blocks),
                                        "--num-host-blocks", str(args.num_host_blocks),
                                        "--pooled-sample-rate", str(args.pooled_sample_rate)))
        prometheus = None
        try:
            server.wait_ready(timeout_s=120)
            prometheus = Prometheus(args.prometheus_bin, workdir, [server.target])
            prometheus.wait_ready()
            prometheus.wait_for_scrape()
            start_s = time.time()
            num_sent = drive_rounds(server, prometheus, args.duration_s)
            end_s = time.time()
            print(f"sent {num_sent} requests in {end_s - start_s:.1f} s")
            paths = render(prometheus, args.out, start_s - 5, end_s, variables)
        finally:
            if prometheus is not None:
                prometheus.stop()
            server.stop()
    for path in paths:
        print(f"wrote {path.relative_to(REPO) if path.is_relative_to(REPO) else path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
