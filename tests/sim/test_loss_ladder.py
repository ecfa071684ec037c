"""benchmarks/bench_loss_ladder.py on quick workloads: at R = 1 the online pooled bound is
the exact pooled LRU replayed from the simulated run."""

import json

import pytest

from benchmarks import bench_loss_ladder
from benchmarks.simlib.experiment import MOONCAKE_TRACE

# the Mooncake trace lives beside the repository, not in it (a clean clone has none)
WORKLOADS = [w for w in bench_loss_ladder.WORKLOADS
             if w != "mooncake" or MOONCAKE_TRACE.exists()]


def test_at_rate_one_the_online_bound_is_the_exact_one(capsys):
    out = bench_loss_ladder.main(["--quick", "--skip-actor", "--no-spread", "--rate", "1",
                                  "--workloads", ",".join(WORKLOADS)])
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["rate"] == 1.0
    assert out["causes_sum_ok"] is True
    for name, row in out["workloads"].items():
        for multiple, err in row["err"].items():
            if name == "shared_prefix":
                # its prompts recur whole and end on a block boundary: the engine (and the
                # exact LRU) computes the last token of a fully cached prompt, which the
                # online bound counts as a hit, one token a repeat
                assert 0 < err < 1e-3, (name, multiple)
            else:
                assert err == pytest.approx(0, abs=1e-12), (name, multiple)
