"""The router what-ifs the simulator installs (benchmarks/simlib/whatifs.py): each changes
the load as it did inside the product's Router, and none is set by default."""

import pytest

from benchmarks.simlib.whatifs import WhatIfRouter, WhatIfs, make_router
from kv.events import EventLog
from protocol.engine import EngineStats
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h

B = 16
REPLICAS = ["r0", "r1"]


def prompt(*block_ids: int) -> list[bytes]:
    return [h(i) for i in block_ids]


def whatif_router(clock=None, *, holding: bool = False, half_life_s: float = 0.0,
                  router_kw: dict | None = None, **whatifs) -> WhatIfRouter:
    config = RouterConfig(block_size=B, recent_work_half_life_s=half_life_s,
                          **(router_kw or {}))
    router = WhatIfRouter(config, WhatIfs(**whatifs), clock or FakeClock())
    if holding:
        log = EventLog("r0", epoch="e0")
        assert router.apply_batch(log.drain())
        router.apply_snapshot(log.snapshot(prompt(0, 1, 2), ()))  # r0 holds 48 tokens
    return router


def test_no_whatif_is_the_products_router():
    router = make_router(RouterConfig(block_size=B), WhatIfs(), FakeClock())
    assert type(router) is Router
    assert type(make_router(RouterConfig(block_size=B), WhatIfs(recent_prefill_fraction=0.5),
                            FakeClock())) is WhatIfRouter
    assert WhatIfs().is_default and not WhatIfs(first_token_signal=True).is_default


@pytest.mark.parametrize("kw, message", [
    ({"recent_prefill_fraction": 1.5}, r"recent_prefill_fraction must be in \[0, 1\]"),
    ({"running_decode_weight": -0.5}, r"running_decode_weight must be in \[0, 1\]"),
])
def test_whatifs_are_validated(kw, message):
    with pytest.raises(ValueError, match=message):
        WhatIfs(**kw)


def test_with_a_first_token_signal_the_prefill_leaves_at_the_first_token():
    router = whatif_router(holding=True, first_token_signal=True,
                           router_kw=dict(cached_load_fraction=0.25, decode_weight=0.5))
    router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
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


def test_after_its_first_token_a_request_keeps_its_decode_at_running_decode_weight():
    router = whatif_router(holding=True, first_token_signal=True, running_decode_weight=0.25)
    router.route("q", prompt(7, 8), 2 * B, REPLICAS, max_tokens=40)  # r0: 32 + 40
    assert router.loads.load("r0") == 72.0
    router.on_first_token("q")
    assert router.loads.load("r0") == 0.25 * 40
    router.check_invariants()
    router.on_finished("q")
    assert router.loads.load("r0") == 0.0


def test_without_the_signal_the_first_token_changes_nothing():
    router = whatif_router(holding=True, running_decode_weight=0.25)
    router.route("q", prompt(7, 8), 2 * B, REPLICAS, max_tokens=40)
    router.on_first_token("q")
    assert router.loads.load("r0") == 72.0


def test_recent_work_counts_uncached_prefill_at_recent_prefill_fraction():
    clock = FakeClock()
    router = whatif_router(clock, holding=True, half_life_s=10.0,
                           router_kw=dict(cached_load_fraction=0.25),
                           recent_prefill_fraction=0.5)
    router.route("q", prompt(0, 1, 2, 3), 4 * B, REPLICAS, max_tokens=10)
    # outstanding: 16 uncached + 0.25 x 48 cached + 10 decode; recent: the uncached 16 at half
    assert router.loads.load("r0") == 16 + 12 + 10
    router.on_finished("q")
    assert router.loads.load("r0") == 8 + 12 + 10
    clock.advance(10.0)
    assert router.loads.load("r0") == 15.0
    router.check_invariants()


def test_a_withdrawn_request_takes_exactly_its_recent_part_away():
    router = whatif_router(half_life_s=10.0, recent_prefill_fraction=0.0,
                           first_token_signal=True)
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
    router = whatif_router(holding=True, half_life_s=10.0,
                           router_kw=dict(cached_load_fraction=0.0),
                           recent_prefill_followup_cap=True)
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
    router = whatif_router(half_life_s=10.0, recent_work_ends_when_idle=ends_when_idle)
    router.route("q", prompt(0, 1), 2 * B, REPLICAS, max_tokens=8)  # r0: 32 + 8 = 40
    router.on_finished("q")
    router.update_stats("r0", _stats(num_running=1, num_waiting=0))  # busy: kept
    assert router.loads.load("r0") == 40.0
    router.update_stats("r0", _stats(num_running=0, num_waiting=0))
    assert router.loads.load("r0") == (0.0 if ends_when_idle else 40.0)
    router.check_invariants()


def test_running_decode_weight_discounts_the_published_running_requests():
    router = whatif_router(running_decode_weight=0.5)
    product = Router(RouterConfig(block_size=B, recent_work_half_life_s=0.0), FakeClock())
    for r in (router, product):
        r.route("q", prompt(0, 1), 2 * B, ["r0"], max_tokens=100)  # mean decode 5 tokens
        r.on_finished("q")
        r.update_stats("r0", _stats(num_running=4, num_waiting=2))
    assert product.loads.load("r0") == (4 + 2) * 5.0
    assert router.loads.load("r0") == (0.5 * 4 + 2) * 5.0


def test_decode_charged_as_max_tokens_only_when_asked():
    for as_max_tokens, charged in ((False, 20.0), (True, 500.0)):
        router = whatif_router(decode_charge_max_tokens=as_max_tokens,
                               router_kw=dict(cached_load_fraction=0.0))
        router.route("a", prompt(0), B, REPLICAS, max_tokens=500)
        router.on_finished("a", output_tokens=20)  # the mean output is 20 now
        router.route("b", prompt(1), B, REPLICAS, max_tokens=500)
        assert router.loads.load(router.ledger.get("b").replica_id) == B + charged
