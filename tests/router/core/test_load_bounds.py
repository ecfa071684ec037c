"""Whatever number reaches the router core, a replica's load stays finite and returns to
its baseline: the entry points refuse such numbers first, and this holds if one does not."""

import math

import pytest

from protocol.engine import EngineStats
from router.core.load import MAX_WORK_TOKENS, LoadTracker, bounded_tokens
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h

REPLICAS = ["r0", "r1"]
HALF_LIFE_S = 30.0


def make_router(clock: FakeClock) -> Router:
    return Router(RouterConfig(block_size=16, recent_work_half_life_s=HALF_LIFE_S), clock)


@pytest.mark.parametrize("max_tokens", [10**309, 10**9, math.inf, math.nan, -5])
def test_no_output_length_makes_a_load_infinite_or_lasting(max_tokens):
    clock = FakeClock()
    router = make_router(clock)
    decision = router.route("q", [h(0)], 16, REPLICAS, max_tokens=max_tokens)
    load = router.loads.load(decision.replica_id)
    assert 0 <= load <= MAX_WORK_TOKENS + 16
    router.on_finished("q")
    # its recent work halves every half-life: back under a token after log2(cap) of them
    clock.advance(HALF_LIFE_S * (math.log2(MAX_WORK_TOKENS + 16) + 1))
    assert router.loads.load(decision.replica_id) < 1.0
    router.route("next", [h(1)], 16, REPLICAS, max_tokens=8)  # routing goes on
    router.check_invariants()


def test_a_withdrawn_route_takes_its_recent_work_back_at_once():
    router = make_router(FakeClock())
    decision = router.route("q", [h(0)], 16, REPLICAS, max_tokens=10**6)
    router.withdraw("q")
    assert router.loads.load(decision.replica_id) == 0.0
    assert router.loads.num_outstanding(decision.replica_id) == 0
    router.withdraw("q")  # twice, or unknown: ignored
    router.check_invariants()


def test_published_counts_are_bounded():
    loads = LoadTracker()
    loads.add("q", "r0", 16.0, decode_tokens=10**400)  # the decode mean stays finite too
    loads.update_stats("r0", EngineStats(
        num_running=10**400, num_waiting=2**70, num_queued_prefill_tokens=10**400,
        num_blocks=1, num_used_blocks=0, num_cached_blocks=0, num_pinned_blocks=0,
        num_free_blocks=1, num_host_blocks=0, num_host_cached_blocks=0))
    assert math.isfinite(loads.load("r0")) and loads.mean_decode_tokens <= MAX_WORK_TOKENS


def test_bounded_tokens():
    assert [bounded_tokens(x) for x in (5, 2.5, 0, -1, math.nan, math.inf, 10**400)] == [
        5.0, 2.5, 0.0, 0.0, 0.0, MAX_WORK_TOKENS, MAX_WORK_TOKENS]
