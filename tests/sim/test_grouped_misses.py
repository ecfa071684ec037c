"""benchmarks/simlib/grouped_misses.py: each request's prefix and question outcome."""

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.grouped_misses import run_classified
from tests.sim.conftest import make_sim


def grouped(num_groups):
    # 64-token system prompts (4 blocks) and 32-token questions (2 blocks), one at a time
    return wl.shared_prefix(num_groups=num_groups, prompts_per_group=2, system_prompt_len=64,
                            question_len=32, output_len=4, rate_qps=0.5, passes=2)


def test_with_room_for_everything_every_repeat_is_a_hit():
    sim = make_sim(grouped(2), num_replicas=1, num_blocks=256)
    run, counts = run_classified(sim, prefix_blocks=4, question_blocks=2)
    assert counts == {"prefix first": 2, "prefix hit": 6, "question first": 4,
                      "question hit": 4}
    # a fully cached prompt still computes its last token: 4 repeats hit 95 of 96 tokens
    assert sum(r.cached_device_tokens for r in run.records) == 6 * 64 + 4 * 32 - 4


def test_a_replica_too_small_for_a_pass_loses_its_questions_where_they_were():
    # 6 groups x (4 + 2 x 2) blocks = 48 blocks a pass into 16: every repeat was evicted,
    # on the one replica it went to before
    sim = make_sim(grouped(6), num_replicas=1, num_blocks=16)
    _, counts = run_classified(sim, prefix_blocks=4, question_blocks=2)
    assert counts["prefix first"] == 6 and counts["question first"] == 12
    repeats = {k: v for k, v in counts.items() if k.startswith("question") and "first" not in k}
    assert sum(repeats.values()) == 12
    assert repeats.get("question nowhere, same", 0) > 0
    assert not any("moved" in k or "elsewhere" in k for k in counts)
