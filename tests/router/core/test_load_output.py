"""A request's decode work is charged as what requests really produce, not its max_tokens:
the ends report their output tokens, which teach the mean output length and correct the
replica's recent work to the work done."""

import math

import pytest

from kv.events import EventLog
from protocol.engine import EngineStats
from router.core.load import LoadTracker
from router.core.router import Router, RouterConfig
from tests.router.core.core_helpers import FakeClock, h

B = 16
REPLICAS = ["r0", "r1"]
PREFIX = [h(i) for i in range(50)]  # 800 tokens the victim's requests share, cached on r0
HOSTILE_PREFIX = [h(100), h(101)]  # 32 tokens a hostile tenant's prompts share, on r0


def make_router(clock: FakeClock, **kw) -> Router:
    router = Router(RouterConfig(block_size=B, **kw), clock=clock)
    log = EventLog("r0", epoch="e0")
    assert router.apply_batch(log.drain())
    router.apply_snapshot(log.snapshot(PREFIX + HOSTILE_PREFIX, ()))
    return router


def victim(i: int) -> list[bytes]:
    return PREFIX + [h(1000 + i)]


def test_a_large_max_tokens_does_not_move_a_cached_request_off_its_cache():
    router = make_router(FakeClock())
    assert router.route("v0", victim(0), 51 * B, REPLICAS, max_tokens=16).replica_id == "r0"
    router.on_finished("v0", output_tokens=16)
    # a valid request asking for 4,000 tokens, routed to r0 on its own cached prefix
    assert router.route("hostile", HOSTILE_PREFIX + [h(102)], 3 * B, REPLICAS,
                        max_tokens=4000).replica_id == "r0"
    # charged as the 16 tokens requests produce here, the victim's next request stays on
    # its 800 cached tokens (charged 4,000, r0's load priced 0.2 x 4,000 > 800 moved it)
    assert router.route("v1", victim(1), 51 * B, REPLICAS, max_tokens=16).replica_id == "r0"
    router.check_invariants()


def test_the_decode_charged_is_the_mean_output_or_max_tokens_when_less():
    loads = LoadTracker()
    assert loads.decode_tokens(4000) == 4000  # no output known yet: all it may produce
    loads.finish("unknown", output_tokens=7)  # an unknown id teaches nothing
    assert loads.mean_output_tokens is None
    loads.add("a", "r0", 10.0, decode_tokens=4000)
    loads.finish("a", output_tokens=20)
    assert loads.mean_output_tokens == 20.0
    assert (loads.decode_tokens(4000), loads.decode_tokens(5)) == (20.0, 5.0)
    loads.add("b", "r0", 10.0, decode_tokens=20)
    loads.finish("b", output_tokens=120)  # the mean moves 5% of the way per end
    assert loads.mean_output_tokens == 25.0
    loads.add("c", "r0", 10.0, decode_tokens=25)
    loads.finish("c", output_tokens=10**400)  # bounded like every count
    assert math.isfinite(loads.mean_output_tokens)


@pytest.mark.parametrize("output_tokens", [20, 400])
def test_an_end_corrects_the_recent_work_to_the_work_done(output_tokens):
    clock = FakeClock()
    loads = LoadTracker(decode_weight=1.0, recent_half_life_s=10.0, clock=clock)
    loads.add("q", "r0", 32.0 + 100, decode_tokens=100)  # 32 prefill + 100 decode charged
    clock.advance(10.0)
    loads.finish("q", output_tokens=output_tokens)
    # as if it had been charged 32 + its output when routed, one half-life ago
    assert loads.load("r0") == (32 + output_tokens) / 2
    loads.check_invariants()


def test_an_end_without_its_output_keeps_the_charge():
    clock = FakeClock()
    loads = LoadTracker(recent_half_life_s=10.0, clock=clock)
    loads.add("q", "r0", 132.0, decode_tokens=100)
    loads.finish("q")
    assert loads.load("r0") == 132.0 and loads.mean_output_tokens is None


def test_published_counts_weigh_the_mean_output_once_known():
    loads = LoadTracker()
    loads.add("q", "r0", 1000.0, decode_tokens=1000)  # the mean decode charged: 50
    loads.update_stats("r0", EngineStats(
        num_running=2, num_waiting=0, num_queued_prefill_tokens=0, num_blocks=1,
        num_used_blocks=0, num_cached_blocks=0, num_pinned_blocks=0, num_free_blocks=1,
        num_host_blocks=0, num_host_cached_blocks=0))
    loads.finish("q")
    assert loads.load("r0") == 2 * 50.0
    loads.add("p", "r1", 8.0, decode_tokens=8)
    loads.finish("p", output_tokens=8)
    assert loads.load("r0") == 2 * 8.0  # two running requests of 8 tokens each
    assert loads.published("r0") == (0.0, 2.0, 0.0) and loads.published("r9") is None


def test_a_withdraw_takes_back_what_is_left_of_its_recent_work_only():
    clock = FakeClock()
    router = make_router(clock, recent_work_half_life_s=10.0)
    router.route("a", [h(7)], B, ["r1"], max_tokens=16)  # 16 + 16 on r1
    router.on_finished("a", output_tokens=16)
    router.route("b", [h(8)], B, ["r1"], max_tokens=16)
    clock.advance(10.0)
    router.withdraw("b")  # b's 32 tokens, halved since: a's half is left, exactly
    assert router.loads.load("r1") == 16.0
    router.check_invariants()


def test_a_request_of_n_completions_is_charged_n_of_them():
    loads = LoadTracker()
    loads.add("a", "r0", 10.0, decode_tokens=8 * 100, num_sequences=8)
    loads.finish("a", output_tokens=8 * 20)  # 8 completions of 20 tokens
    assert loads.mean_output_tokens == 20.0  # per completion
    assert loads.decode_tokens(8 * 100, num_sequences=8) == 160.0
    assert loads.decode_tokens(100) == 20.0
    assert loads.decode_tokens(8 * 5, num_sequences=8) == 40.0  # max_tokens is less


def test_the_router_charges_each_completion_of_a_request():
    # no recent work: a replica's load is its outstanding work alone
    router = make_router(FakeClock(), recent_work_half_life_s=0.0)
    router.route("v0", victim(0), 51 * B, ["r1"], max_tokens=100)
    router.on_finished("v0", output_tokens=20)  # requests here produce 20 tokens
    router.route("one", [h(200)], B, ["r1"], max_tokens=100)
    load_one = router.loads.load("r1")
    router.on_finished("one", output_tokens=20)
    router.route("eight", [h(201)], B, ["r1"], max_tokens=8 * 100, num_sequences=8)
    # the same prefill (one uncached block), and 20 decode tokens for each completion
    assert router.loads.load("r1") == load_one + 7 * 20 * router.config.decode_weight
    router.check_invariants()
