"""benchmarks/sim_routing.py end to end on quick workloads."""

import json
import os
import subprocess
import sys
from pathlib import Path

from benchmarks import sim_routing
from benchmarks.simlib.plots import replot

SCRIPT = Path(sim_routing.__file__)
KEYS = {"hit_rate", "pooled_bound_hit_rate", "hit_rate_over_bound", "load_share", "ttft_p90_s",
        "throughput_tok_s", "ttft_p90_ratio_vs_round_robin", "ttft_p90_ratio_vs_approximate"}


def test_the_last_line_is_the_json_with_the_baselines_ratios(capsys):
    out = sim_routing.main(["--workload", "generated_shared_prefix", "--replicas", "4",
                            "--quick"])
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert KEYS <= set(last) and last["replicas"] == 4 and last["quick"] is True
    assert out["hit_rate_over_bound"] == out["hit_rate"] / out["pooled_bound_hit_rate"]
    # 8 groups of 4 on 4 replicas: each group's first request computes its prefix.
    assert out["pooled_bound_hit_rate"] == out["hit_rate"] == 3 * 2048 / (4 * 2176)


def test_a_ladder_writes_its_plot_and_summaries(tmp_path):
    out = sim_routing.main(["--workload", "multi_turn", "--replicas", "2", "--quick",
                            "--ladder", "4,40", "--out-dir", str(tmp_path)])
    dump = json.loads((tmp_path / "multi_turn_r2.json").read_text())
    assert set(dump["runs"]) == {"cache_aware", "round_robin", "approximate"}
    assert [len(v) for v in dump["runs"].values()] == [2, 2, 2]
    png = tmp_path / "multi_turn_r2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["plot"] == str(png)
    png.unlink()
    assert replot(tmp_path / "multi_turn_r2.json") == png and png.stat().st_size > 10_000


def test_runs_repeat_exactly_across_processes_and_hash_seeds():
    def run(hash_seed: str) -> dict:
        env = {**os.environ, "PYTHONHASHSEED": hash_seed}
        proc = subprocess.run([sys.executable, str(SCRIPT), "--workload", "multi_turn",
                               "--replicas", "3", "--quick", "--others", "random"],
                              capture_output=True, text=True, env=env, timeout=300,
                              check=True)
        last = json.loads(proc.stdout.strip().splitlines()[-1])
        del last["wall_s"], last["cpu_s"]
        return last

    assert run("1") == run("2")
