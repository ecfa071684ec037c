"""Exact scheduling decisions on scripted cases (no model: tokens are fed by hand)."""

from kv.events import EventLog
from kv.hashing import namespace_root
from kv.manager import KVCacheConfig, KVCacheManager
from protocol.engine import SampledToken, SamplingParams
from worker.engine.request import Request
from worker.engine.scheduler import Scheduler, SchedulerConfig

B = 4
ROOT = namespace_root("m")


def make(num_blocks=16, budget=64, max_num_seqs=8, eos=None):
    kv = KVCacheManager(KVCacheConfig(num_blocks=num_blocks, block_size=B),
                        EventLog("r", epoch="e"))
    cfg = SchedulerConfig(max_num_seqs=max_num_seqs, max_num_batched_tokens=budget,
                          max_model_len=256,
                          eos_token_ids=() if eos is None else (eos,))
    return Scheduler(cfg, kv)


def req(rid, tokens, max_tokens=4, t=0.0, **kw):
    return Request(rid, list(tokens), SamplingParams(max_tokens=max_tokens, **kw), B, ROOT,
                   arrival_time=t)


def sampled(**token_ids):
    return {rid: SampledToken(t) for rid, t in token_ids.items()}


def run_step(s, token=7):
    out = s.schedule()
    s.update(out.step, {q.request_id: SampledToken(token) for q in out.step.seqs if q.sample})
    s.check_invariants()
    return out


def layout(out):
    return [(q.request_id, q.start_pos, len(q.token_ids), q.sample, q.skip_kv_write)
            for q in out.step.seqs]


def test_budget_counts_only_uncached_tokens():
    s = make(budget=12)
    prefix = list(range(100, 112))  # 3 blocks
    s.add(req("a", prefix + [1, 2, 3, 4]))
    assert layout(run_step(s)) == [("a", 0, 12, False, 0)]  # chunked at the budget
    assert layout(run_step(s)) == [("a", 12, 4, True, 0)]
    s.finish("a", "abort")
    # b shares a's 3 cached blocks: only its 8 uncached tokens take budget, so c fits too.
    s.add(req("b", prefix + [5, 6, 7, 8, 9, 10, 11, 12]))
    s.add(req("c", [50, 51, 52, 53]))
    assert layout(run_step(s)) == [("b", 12, 8, True, 0), ("c", 0, 4, True, 0)]
    assert s.requests["b"].num_cached_device_tokens == 12
    assert s.kv.stats.device_hit_tokens == 12 and s.kv.stats.query_tokens == 16 + 20 + 4


def test_fully_cached_prompt_computes_only_its_last_token():
    s = make()
    prompt = list(range(100, 108))  # exactly 2 blocks
    s.add(req("a", prompt))
    run_step(s)
    s.finish("a", "abort")
    s.add(req("b", prompt))
    out = run_step(s)
    assert layout(out) == [("b", 7, 1, True, 1)]  # KV of token 7 is already cached
    assert s.requests["b"].num_cached_device_tokens == 7


def test_shared_prefix_in_one_batch_is_computed_once():
    s = make(budget=64)
    prefix = list(range(200, 216))  # 4 blocks
    for i in range(3):
        s.add(req(f"r{i}", prefix + [i] * 4))
    assert layout(run_step(s)) == [("r0", 0, 20, True, 0)]  # r1, r2 wait for r0's blocks
    out = run_step(s)
    assert layout(out) == [("r0", 20, 1, True, 0), ("r1", 16, 4, True, 0),
                           ("r2", 16, 4, True, 0)]
    assert s.kv.stats.device_hit_tokens == 32


def test_shared_prefix_across_chunks_waits_for_the_whole_prefix():
    s = make(budget=8)
    prefix = list(range(300, 316))
    s.add(req("a", prefix + [1]))
    s.add(req("b", prefix + [2]))
    assert layout(run_step(s)) == [("a", 0, 8, False, 0)]
    assert layout(run_step(s)) == [("a", 8, 8, False, 0)]
    assert layout(run_step(s)) == [("a", 16, 1, True, 0), ("b", 16, 1, True, 0)]


def test_old_request_is_not_starved_by_newer_ones():
    # 6 blocks. "big" (5 blocks) arrives while "s0" holds 2; newer small requests keep
    # arriving and would fit, but must not overtake it.
    s = make(num_blocks=6, budget=64)
    s.add(req("s0", [1] * 8, max_tokens=2))
    run_step(s)
    s.add(req("big", list(range(20)), max_tokens=1))
    for i in range(3):
        s.add(req(f"n{i}", [9 + i] * 3, max_tokens=1))
        out = run_step(s)
        assert "n" not in "".join(out.admitted_ids)
        if "s0" not in s.requests:
            break
    out = run_step(s)
    assert out.admitted_ids[0] == "big"


def test_preemption_is_newest_first_and_recomputes():
    s = make(num_blocks=4, budget=64)
    s.add(req("old", [1, 2, 3], max_tokens=10, t=0.0))
    s.add(req("new", [4, 5, 6], max_tokens=10, t=1.0))
    # Step k computes token k+2 of each; steps 1..6 fit in 2 blocks (8 tokens) each.
    for _ in range(6):
        assert run_step(s).preempted_ids == []
    # Step 7 computes token 9 of "old": a 3rd block, none free: "new" is preempted.
    out = run_step(s)
    assert out.preempted_ids == ["new"]
    assert [r.request_id for r in s.waiting] == ["new"]
    assert s.requests["new"].num_computed_tokens == 0
    assert s.num_preemptions == 1
    # Once "old" finishes, "new" is recomputed (prompt + its 6 outputs = 9 tokens). Its
    # blocks were freed tail first, so "old" evicted its 2nd block and its 1st is a hit.
    while "old" in s.requests:
        run_step(s)
    out = run_step(s)
    assert layout(out) == [("new", 4, 5, True, 0)]


def test_stop_conditions():
    s = make(eos=0)
    s.add(req("eos", [1, 2], max_tokens=10))
    s.add(req("stop_id", [3, 4], max_tokens=10, stop_token_ids=(7,)))
    s.add(req("len", [5, 6], max_tokens=2, ignore_eos=True))
    out = s.schedule()
    s.update(out.step, sampled(eos=0, stop_id=7, len=0))
    assert s.requests.keys() == {"len"}
    out = s.schedule()
    finished = s.update(out.step, sampled(len=0))
    assert finished[0].finish_reason == "length" and not s.requests
    assert s.kv.usage()["used"] == 0


def test_min_tokens_holds_eos_and_stop_token_ids_back_until_reached():
    s = make(eos=0)
    s.add(req("eos", [1, 2], max_tokens=10, min_tokens=2))
    s.add(req("stop_id", [3, 4], max_tokens=10, stop_token_ids=(7,), min_tokens=2))
    out = s.schedule()
    assert [q.num_output_tokens for q in out.step.seqs] == [0, 0]
    s.update(out.step, sampled(eos=0, stop_id=7))  # output token 1 of at least 2
    out = s.schedule()
    assert [q.num_output_tokens for q in out.step.seqs] == [1, 1]
    s.update(out.step, sampled(eos=0, stop_id=7))  # token 2: min_tokens reached, not past
    assert s.requests.keys() == {"eos", "stop_id"}
    out = s.schedule()
    finished = s.update(out.step, sampled(eos=0, stop_id=7))  # token 3 may stop
    assert [(r.request_id, r.finish_reason, r.num_output_tokens) for r in finished] == [
        ("eos", "stop", 3), ("stop_id", "stop", 3)]
    assert not s.requests


def test_abort_frees_blocks_and_ignores_inflight_results():
    s = make()
    s.add(req("a", [1, 2, 3, 4, 5]))
    out = s.schedule()
    s.finish("a", "abort")
    assert s.update(out.step, sampled(a=3)) == []
    assert s.kv.usage()["used"] == 0
    s.check_invariants()
