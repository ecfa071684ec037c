"""benchmarks/peers/placements.py on scripted runs (no workers)."""

from benchmarks.peers.placements import compare, moved


def rec(rid: str, worker: int | None, cached: int = 0) -> dict:
    return {"request_id": rid, "worker": worker, "cached_tokens": cached,
            "prompt_tokens": 100, "sent_s": 0.0, "first_chunk_s": 0.1}


def test_a_turn_is_moved_only_when_both_workers_are_known_and_differ():
    records = {r["request_id"]: r for r in (
        rec("mt-c0-r0", 0), rec("mt-c0-r1", 1), rec("mt-c0-r2", 1),
        rec("mt-c1-r0", 2), rec("mt-c1-r1", None), rec("mt-c1-r2", 3))}
    assert moved(records) == {"mt-c0-r1"}


def test_compare_sums_cached_token_differences_by_round_and_moves():
    base = {r["request_id"]: r for r in (rec("mt-c0-r0", 0), rec("mt-c0-r1", 0, 64))}
    other = {r["request_id"]: r for r in (rec("mt-c0-r0", 1), rec("mt-c0-r1", 2, 16))}
    summary = {"router": "b", "seed": 1}
    lines = compare((summary, base), ({"router": "o", "seed": 1}, other))
    assert lines[0].startswith("  o - b (seed 1): cached tokens -48 (-0.2400")
    assert lines[1:3] == ["    r0 stayed/stayed:   1 turns,      +0 tokens",
                          "    r1 stayed/moved:   1 turns,     -48 tokens"]
