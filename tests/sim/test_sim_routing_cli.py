"""benchmarks/sim_routing.py end to end on quick workloads."""

import functools
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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
    # the dump rounds to 6 decimals
    runs = {k: [sim_routing.Summary(**s) for s in v] for k, v in dump["runs"].items()}
    near = functools.partial(pytest.approx, abs=2e-6)
    ca, ap = runs["cache_aware"], runs["approximate"]
    assert out["worst_hit_minus_approximate"] == near(min(
        ca[i].hit_rate - ap[i].hit_rate for i in range(2)))
    assert out["worst_ttft_p90_over_approximate"] == near(max(
        ca[i].ttft_p90_s / ap[i].ttft_p90_s for i in range(2)), rel=1e-4)
    assert out["max_load_share"] == near(max(s.load_share for s in ca))
    sat = out["saturation_rate_qps"]
    assert out["worst_hit_over_bound_below_saturation"] == near(min(
        s.hit_rate_over_bound for s in ca if sat is None or s.rate_qps < sat))
    png = tmp_path / "multi_turn_r2.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert out["plot"] == str(png)
    png.unlink()
    assert replot(tmp_path / "multi_turn_r2.json") == png and png.stat().st_size > 10_000


def test_policy_only_runs_the_policy_alone_with_the_max_tokens_sent(tmp_path, capsys):
    argv = ["--workload", "mooncake", "--replicas", "2", "--quick", "--ladder", "1",
            "--out-dir", str(tmp_path), "--policy-only"]
    sim_routing.main(argv)
    exact = sim_routing.main([*argv, "--max-tokens-sent", "exact", "--tag", "_exact",
                              "--router", "decode_charge_max_tokens=true"])
    dump = json.loads((tmp_path / "mooncake_r2_exact.json").read_text())
    assert set(dump["runs"]) == {"cache_aware"} and dump["args"]["max_tokens_sent"] == "exact"
    assert "worst_hit_minus_approximate" not in exact and exact["saturation_rate_qps"] is None
    # the same requests and answers, routed on another forecast of their decode
    runs = [json.loads((tmp_path / f).read_text())["runs"]["cache_aware"][0]
            for f in ("mooncake_r2.json", "mooncake_r2_exact.json")]
    assert runs[0]["num_requests"] == runs[1]["num_requests"] == 60
    capsys.readouterr()


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


def test_a_what_if_sets_router_fields_and_rejects_unknown_ones(capsys):
    args = sim_routing.parse_args(["--workload", "burst", "--router", "load_weight=0.5",
                                   "--router", "imbalance_threshold=inf"])
    config = sim_routing.router_base(args, 2048)
    assert (config.load_weight, config.imbalance_threshold) == (0.5, float("inf"))
    bad = sim_routing.parse_args(["--workload", "burst", "--router", "weight=1"])
    try:
        sim_routing.router_base(bad, 2048)
    except SystemExit as err:
        assert "--router 'weight=1': want NAME=VALUE" in str(err)
    else:
        raise AssertionError("an unknown RouterConfig field was accepted")


def test_a_gateway_ladder_measures_each_count_against_one(tmp_path, capsys):
    out = sim_routing.main(["--workload", "generated_shared_prefix", "--replicas", "2",
                            "--quick", "--ladder", "8,16", "--gateways", "2,1",
                            "--share-pending-delay-s", "0.001", "--out-dir", str(tmp_path)])
    dump = json.loads((tmp_path / "generated_shared_prefix_r2_gw1-2.json").read_text())
    assert list(dump["runs"]) == ["cache_aware", "round_robin", "cache_aware@2gw",
                                  "cache_aware@2gw+marks"]
    runs = {k: [sim_routing.Summary(**s) for s in v] for k, v in dump["runs"].items()}
    one, two, shared = runs["cache_aware"], runs["cache_aware@2gw"], \
        runs["cache_aware@2gw+marks"]
    below = [i for i in range(2) if out["saturation_rate_qps"] is None
             or one[i].rate_qps < out["saturation_rate_qps"]]
    near = functools.partial(pytest.approx, abs=2e-6)
    assert out["worst_hit_loss_vs_one_gateway"] == near(max(
        one[i].hit_rate - two[i].hit_rate for i in below))
    assert out["worst_hit_loss_vs_one_gateway_marks"] == near(max(
        one[i].hit_rate - shared[i].hit_rate for i in below))
    assert out["max_load_share"] == near(max(s[i].load_share for s in (one, two)
                                             for i in below))
    assert all(s.shared_blocks_per_decision > 0 for s in shared)
    assert all(s.shared_blocks_per_decision == 0 for s in one + two)
    printed = capsys.readouterr().out
    assert "hit rate and load share per rung and contender" in printed
    assert json.loads(printed.strip().splitlines()[-1])["per_contender"] == out["per_contender"]


def test_gateway_options_are_checked(capsys):
    for argv, message in [(["--gateways", "2,8"], "1 among them"),
                          (["--gateways", "1,x"], "comma-separated integers"),
                          (["--gateways", "1,2", "--spread", "hash"], "--spread: each of"),
                          (["--share-pending-delay-s", "0.01"], "need --gateways"),
                          (["--rotate-candidates"], "need --gateways"),
                          (["--gateways", "1,8", "--shared-only"],
                           "--shared-only needs --share-pending-delay-s")]:
        with pytest.raises(SystemExit):
            sim_routing.parse_args(["--workload", "burst", *argv])
        assert message in capsys.readouterr().err
    args = sim_routing.parse_args(["--workload", "burst", "--gateways", "8,1,2",
                                   "--spread", "round_robin,session"])
    assert (args.gateways, args.spread) == ([1, 2, 8], ["round_robin", "session"])
