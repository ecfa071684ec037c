"""The load a routed request adds: uncached prefill, cached tokens at cached_load_fraction,
decode at decode_weight; the prefill part leaves at the first token."""

import pytest

from kv.events import EventLog
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h
from worker.api import EngineStats

B = 16
REPLICAS = ["r0", "r1"]


def prompt(*block_ids: int) -> list[bytes]:
    return [h(i) for i in block_ids]


def make_router(**kw) -> Router:
    kw.setdefault("recent_work_half_life_s", 0.0)  # outstanding work only, unless asked
    router = Router(RouterConfig(block_size=B, **kw), clock=FakeClock())
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))  # r0 holds 48 tokens
    return router


def test_cached_tokens_and_decode_weigh_as_configured_and_prefill_leaves_at_first_token():
    router = make_router(cached_load_fraction=0.25, decode_weight=0.5)
    decision = router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
    assert decision.replica_id == "r0" and decision.predicted_device_hit_tokens == 48
    assert router.loads.load("r0") == 16 + 0.25 * 48 + 0.5 * 10
    router.on_first_token("q")
    assert router.loads.load("r0") == 0.5 * 10
    router.on_first_token("q")  # reported twice: no change
    assert router.loads.load("r0") == 0.5 * 10
    router.check_invariants()
    router.on_finished("q")
    assert router.loads.load("r0") == 0.0
    router.on_first_token("q")  # after it finished: ignored
    router.check_invariants()


def test_the_default_counts_a_tenth_of_cached_tokens_and_keeps_recent_work():
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B), clock=clock)
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))
    router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
    assert router.loads.load("r0") == 16 + 0.1 * 48 + 10
    router.on_finished("q")
    clock.advance(30.0)  # the default half-life
    assert router.loads.load("r0") == (16 + 0.1 * 48 + 10) / 2


def test_a_burst_of_one_cached_prompt_spreads_once_its_cached_tokens_weigh():
    # q0 adds 16 + 0.5 x 48 + 1 = 41 tokens of work to r0; each later copy finds all 64
    # tokens cached there (q0's pending mark) and adds 0.5 x 64 + 1 = 33. r1 costs 64 (its
    # whole prompt) and wins once 0.2 x r0's work reaches 64: after 41 + 9 x 33 = 338.
    router = make_router(cached_load_fraction=0.5)
    p = prompt(0, 1, 2, 3)
    got = [router.route(f"q{i}", p, 4 * B, REPLICAS, max_tokens=1).replica_id
           for i in range(11)]
    assert got == ["r0"] * 10 + ["r1"]
    without = make_router(cached_load_fraction=0.0)  # each copy adds 1 token: all on r0
    assert {without.route(f"q{i}", p, 4 * B, REPLICAS, max_tokens=1).replica_id
            for i in range(11)} == {"r0"}


@pytest.mark.parametrize("kw, message", [
    ({"decode_weight": -0.1}, "decode_weight must be finite and >= 0"),
    ({"cached_load_fraction": 1.5}, r"cached_load_fraction must be in \[0, 1\]"),
    ({"recent_work_half_life_s": -1.0}, "recent_work_half_life_s must be finite and >= 0"),
    ({"recent_prefill_fraction": 1.5}, r"recent_prefill_fraction must be in \[0, 1\]"),
])
def test_new_fields_are_validated(kw, message):
    with pytest.raises(ValueError, match=message):
        RouterConfig(**kw)


def test_recent_work_keeps_an_idle_replica_loaded_for_a_while():
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B, recent_work_half_life_s=10.0), clock=clock)
    router.route("q", prompt(0, 1), 2 * B, REPLICAS, max_tokens=8)  # r0: 32 + 8 = 40
    router.on_finished("q")
    assert router.loads.load("r0") == 40.0  # idle, but its work was routed just now
    clock.advance(10.0)
    assert router.loads.load("r0") == 20.0
    clock.advance(10.0)
    router.route("q2", prompt(5), B, REPLICAS, max_tokens=4)  # r1 (r0 still carries 10)
    assert (router.loads.load("r0"), router.loads.load("r1")) == (10.0, 20.0)
    router.check_invariants()


def test_after_its_first_token_a_request_keeps_its_decode_at_running_decode_weight():
    router = make_router(running_decode_weight=0.25)
    router.route("q", prompt(7, 8), 2 * B, REPLICAS, max_tokens=40)  # r0: 32 + 40
    assert router.loads.load("r0") == 72.0
    router.on_first_token("q")
    assert router.loads.load("r0") == 0.25 * 40
    router.check_invariants()
    router.on_finished("q")
    assert router.loads.load("r0") == 0.0


def test_recent_work_counts_uncached_prefill_at_recent_prefill_fraction():
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B, recent_work_half_life_s=10.0,
                                 cached_load_fraction=0.25, recent_prefill_fraction=0.5),
                    clock=clock)
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))  # r0 holds 48 tokens
    router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
    # outstanding: 16 uncached + 0.25 x 48 cached + 10 decode; recent: the uncached 16 at half
    assert router.loads.load("r0") == 16 + 12 + 10
    router.on_finished("q")
    assert router.loads.load("r0") == 8 + 12 + 10
    clock.advance(10.0)
    assert router.loads.load("r0") == 15.0
    router.check_invariants()


def test_a_withdrawn_request_takes_exactly_its_recent_part_away():
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B, recent_work_half_life_s=10.0,
                                 recent_prefill_fraction=0.0), clock=clock)
    router.route("a", prompt(0, 1), 2 * B, ["r0"], max_tokens=8)  # recent: decode 8 only
    router.route("b", prompt(5, 6), 2 * B, ["r0"], max_tokens=4)
    router.on_first_token("b")  # its prefill leaves the outstanding work, not the recent
    router.route("b", prompt(5, 6), 2 * B, ["r1"], max_tokens=4)  # a retry elsewhere
    router.on_finished("a")
    assert router.loads.load("r0") == 8.0
    assert router.loads.load("r1") == 32 + 4
    router.on_finished("b")
    assert router.loads.load("r1") == 4.0
    router.check_invariants()


def test_with_the_follow_up_cap_a_first_prompt_adds_recent_work_only_as_a_follow_up_would():
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B, recent_work_half_life_s=10.0,
                                 cached_load_fraction=0.0, recent_prefill_followup_cap=True),
                    clock=clock)
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))  # r0 holds 48 tokens
    # no follow-up seen yet: a first prompt's 64 uncached tokens all count
    router.route("a", prompt(10, 11, 12, 13), 4 * B, ["r1"], max_tokens=2)
    router.on_finished("a")
    assert router.loads.load("r1") == 64 + 2
    # a follow-up (48 of 64 cached): its 16 uncached tokens start the mean
    router.route("b", prompt(0, 1, 2, 3), 4 * B, ["r0"], max_tokens=2)
    router.on_finished("b")
    assert router.loads.load("r0") == 16 + 2
    # a long first prompt now adds only the follow-ups' 16 uncached tokens as recent work,
    # while it is outstanding its whole 96
    router.route("c", prompt(20, 21, 22, 23, 24, 25), 6 * B, ["r0"], max_tokens=2)
    assert router.loads.load("r0") == 96 + 2
    router.on_finished("c")
    assert router.loads.load("r0") == 16 + 2 + 16 + 2
    router.check_invariants()


def _stats(num_running: int, num_waiting: int) -> EngineStats:
    return EngineStats(num_running=num_running, num_waiting=num_waiting,
                       num_queued_prefill_tokens=0, num_blocks=64, num_used_blocks=0,
                       num_cached_blocks=0, num_pinned_blocks=0, num_free_blocks=64,
                       num_host_blocks=0, num_host_cached_blocks=0)


@pytest.mark.parametrize("ends_when_idle", [False, True])
def test_recent_work_ends_with_idle_stats_only_when_asked(ends_when_idle):
    clock = FakeClock()
    router = Router(RouterConfig(block_size=B, recent_work_half_life_s=10.0,
                                 recent_work_ends_when_idle=ends_when_idle), clock=clock)
    router.route("q", prompt(0, 1), 2 * B, REPLICAS, max_tokens=8)  # r0: 32 + 8 = 40
    router.on_finished("q")
    router.update_stats("r0", _stats(num_running=1, num_waiting=0))  # busy: kept
    assert router.loads.load("r0") == 40.0
    router.update_stats("r0", _stats(num_running=0, num_waiting=0))
    assert router.loads.load("r0") == (0.0 if ends_when_idle else 40.0)
    router.check_invariants()
