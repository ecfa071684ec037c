"""bench_peers.py's table and last JSON line, from its runs (one dict per run)."""

from __future__ import annotations

import json
import os
import statistics
from collections import defaultdict

from benchmarks.peers.routers import PEERS


def _cells(runs: list[dict]) -> dict[tuple[str, str], list[dict]]:
    cells: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in runs:
        cells[(r["workload"], r["router"])].append(r)
    return cells


def hit_over_bound(rows: list[dict]) -> float:
    """Mean hit rate over mean bound (the rounds send different prompts)."""
    return (statistics.mean(r["cached_token_rate"] for r in rows)
            / statistics.mean(r["bound_hit_rate"] for r in rows))


def table(runs: list[dict]) -> list[str]:
    lines = [f"{'workload':<14}{'router':<21}{'runs':>5}{'hit':>7}{'bound':>7}{'hit/bnd':>8}"
             f"{'share':>7}{'req sh':>7}{'ttft p50':>9}{'ttft p90':>9}{'load1m':>7}"]
    for (w, router), rows in _cells(runs).items():
        m = {k: statistics.mean(r[k] for r in rows) for k in
             ("cached_token_rate", "bound_hit_rate", "load_share", "request_share",
              "ttft_p50_s", "ttft_p90_s", "load_1m_end")}
        lines.append(f"{w:<14}{router:<21}{len(rows):>5}{m['cached_token_rate']:>7.3f}"
                     f"{m['bound_hit_rate']:>7.3f}{hit_over_bound(rows):>8.3f}"
                     f"{m['load_share']:>7.3f}{m['request_share']:>7.3f}"
                     f"{m['ttft_p50_s']:>9.3f}{m['ttft_p90_s']:>9.3f}{m['load_1m_end']:>7.2f}")
    return lines


def targets(runs: list[dict]) -> dict:
    cells = _cells(runs)
    workloads = sorted({w for w, _ in cells})
    out: dict = {}
    margins, shares, vs_approx, ttft = [], [], [], []
    for w in workloads:
        events = cells.get((w, "kvroute_events"))
        if not events:
            continue
        ev = hit_over_bound(events)
        shares.append(statistics.mean(r["load_share"] for r in events))
        peers = [p for p in PEERS if cells.get((w, p))]
        if peers:
            margins.append(ev - max(hit_over_bound(cells[(w, p)]) for p in peers))
            # per round (seed): events' p90 over the best peer's; the median of the rounds
            ratios = []
            for r in events:
                best = min(x["ttft_p90_s"] for p in peers for x in cells[(w, p)]
                           if x["seed"] == r["seed"])
                ratios.append(r["ttft_p90_s"] / best)
            ttft.append(statistics.median(ratios))
        approx = cells.get((w, "kvroute_approximate"))
        if approx:
            vs_approx.append(ev - hit_over_bound(approx))
    out["worst_margin_vs_best_peer"] = round(min(margins), 4) if margins else None
    out["max_load_share"] = round(max(shares), 4) if shares else None
    out["worst_events_minus_approximate"] = round(min(vs_approx), 4) if vs_approx else None
    out["worst_ttft_p90_over_best_peer"] = round(max(ttft), 3) if ttft else None
    return out


def report(args, runs: list[dict], versions: dict[str, str], wall_s: float) -> dict:
    lines = table(runs)
    out = targets(runs)
    out["sim_vs_live_abs_err_max"] = None
    if not args.no_sim:
        from benchmarks.sim_vs_live import predict_runs
        errors = predict_runs([r for r in runs if r["router"] in
                               ("kvroute_events", "kvroute_approximate")], lines)
        if errors:
            out["sim_vs_live_abs_err_max"] = round(max(abs(e) for e in errors), 4)
    lines.append(f"peers: {versions or 'none run'}; wall {wall_s:.0f} s; load average now "
                 f"{os.getloadavg()}")
    print("\n".join(lines))
    print(json.dumps(out))
    if getattr(args, "results", None):
        args.results.write_text("\n".join(lines) + "\n" + json.dumps(out) + "\n")
    return out
