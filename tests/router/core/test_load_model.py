"""The load a routed request adds: uncached prefill, cached tokens at cached_load_fraction,
decode at decode_weight. (The what-ifs kept out of the product: tests/sim/test_whatifs.py.)"""

import pytest

from kv.events import EventLog
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h

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


def test_cached_tokens_and_decode_weigh_as_configured():
    router = make_router(cached_load_fraction=0.25, decode_weight=0.5)
    decision = router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
    assert decision.replica_id == "r0" and decision.predicted_device_hit_tokens == 48
    assert router.loads.load("r0") == 16 + 0.25 * 48 + 0.5 * 10
    router.check_invariants()
    router.on_finished("q")
    assert router.loads.load("r0") == 0.0
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
