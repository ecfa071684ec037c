"""Continuation affinity (RouterConfig.continuation_affinity): a conversation's later turns
go where its last turn went, unless the guard lets the cost move them."""

import math
import random
from dataclasses import replace

import numpy as np
import pytest

from router.core.config import RouterConfig
from router.core.policies import ReplicaView, RouteQuery
from router.core.policies.cache_aware import CacheAwarePolicy
from router.core.policies.continuation import ContinuationGuard, Continuations
from router.core.prefix_match import PrefixMatch
from router.core.router import Router
from tests.router.core.core_helpers import FakeClock, h

B = 16
IDS = ("a", "b")
OPEN = ContinuationGuard(load_over_mean=math.inf, session_share=math.inf,
                         max_load_over_gain=math.inf)  # no guard


def turns(session: int, n: int) -> list[list[bytes]]:
    """A session's first n prompts: each turn adds 4 blocks to the last."""
    return [[h(1000 * session + i) for i in range(4 * (t + 1))] for t in range(n)]


def rank(policy: CacheAwarePolicy, name: str, hashes, loads: dict[str, float],
         ids=IDS, matches: dict[str, PrefixMatch] | None = None) -> str:
    query = RouteQuery(name, hashes, B * len(hashes), 0, ids)
    return policy.rank(query, ReplicaView(matches or {}, lambda rid: loads.get(rid, 0.0)))[0]


def policy(guard: ContinuationGuard | None = None, on: bool = True) -> CacheAwarePolicy:
    return CacheAwarePolicy(RouterConfig(block_size=B, continuation_affinity=on), guard)


def busy(rid: str, tokens: float = 1e6) -> dict[str, float]:
    return {rid: tokens}


def test_with_min_turns_three_a_session_stays_where_its_last_turn_went_from_its_third():
    p = policy(replace(OPEN, min_turns=3))
    t1, t2, t3, t4 = turns(0, 4)
    assert rank(p, "1", t1, {}) == "a"
    # the second turn goes by the cost: a is loaded, nothing cached anywhere
    assert rank(p, "2", t2, busy("a")) == "b"
    # from the third on, it stays on b however loaded b is
    assert rank(p, "3", t3, busy("b")) == "b"
    assert rank(p, "4", t4, busy("b")) == "b"
    assert p.continuations.num_kept == 2
    # a prompt that extends none (the same first prompt again) goes by the cost
    assert rank(p, "5", t1, busy("b")) == "a"
    p.continuations.check_invariants()


def test_off_by_default_every_turn_goes_by_the_cost():
    assert RouterConfig().continuation_affinity is False
    p = policy(on=False)
    assert p.continuations is None
    t1, t2, t3 = turns(0, 3)
    assert [rank(p, "1", t1, {}), rank(p, "2", t2, busy("a")), rank(p, "3", t3, busy("b"))] \
        == ["a", "b", "a"]


def test_by_default_the_second_turn_stays_too():
    p = policy(OPEN)
    t1, t2 = turns(0, 2)
    assert rank(p, "1", t1, {}) == "a"
    assert rank(p, "2", t2, busy("a")) == "a"


def test_a_turn_that_adds_more_than_max_turn_blocks_goes_by_the_cost():
    for added, where in ((4, "a"), (5, "b")):
        p = policy(replace(OPEN, max_turn_blocks=4))
        first = [h(i) for i in range(8)]
        assert rank(p, "1", first, {}) == "a"
        # the next prompt: 8 blocks + `added` (its last block is never a parent's)
        assert rank(p, "2", first + [h(100 + i) for i in range(added)], busy("a")) == where


def third_turn_goes_to(guard: ContinuationGuard, loads: dict[str, float],
                       matches: dict[str, PrefixMatch] | None = None) -> str:
    """Where a session's third turn goes (the index holding `matches` of it): its first two
    went to a."""
    p = policy(guard)
    t1, t2, t3 = turns(0, 3)
    assert rank(p, "1", t1, {}) == "a"
    assert rank(p, "2", t2, {"b": 1.0}) == "a"
    return rank(p, "3", t3, loads, matches=matches)


def test_the_load_guard_releases_a_turn_only_off_a_replica_far_above_the_mean():
    guard = replace(OPEN, load_over_mean=1.5)
    # a 1,000 tokens, b 500: mean 750, a is 1.33x it: kept, though b costs less
    assert third_turn_goes_to(guard, {"a": 1000.0, "b": 500.0}) == "a"
    # a 1,000, b 0: a is 2x the mean: the cost moves it
    assert third_turn_goes_to(guard, {"a": 1000.0}) == "b"


def test_the_session_guard_releases_turns_off_a_replica_holding_most_recent_sessions():
    p = policy(replace(OPEN, session_share=1.5, session_window=3))
    s, u = turns(0, 3), turns(1, 3)
    for name, prompt in (("s1", s[0]), ("s2", s[1]), ("u1", u[0]), ("u2", u[1])):
        assert rank(p, name, prompt, busy("b")) == "a"  # four prompts, all to a
    # the window counts each session once, as its newest turn: s2 (128) and u2 (128) on a
    assert p.continuations._window_tokens == {"a": 256}
    # a holds every recent session's tokens (2x the mean): s's third turn goes by the cost
    assert rank(p, "s3", s[2], busy("a")) == "b"
    assert p.continuations._window_tokens == {"a": 128, "b": 192}
    # u's third turn: a holds 128 of 320 (0.8x the mean): it stays
    assert rank(p, "u3", u[2], busy("a")) == "a"
    assert p.continuations._window_tokens == {"a": 192, "b": 192}
    p.continuations.check_invariants()


def test_the_gain_guard_keeps_a_turn_while_the_load_it_would_shed_is_at_most_k_times_its_hit():
    # the third turn's prompt is 12 blocks (192 tokens); a holds the first 8 (128 tokens)
    guard = replace(OPEN, max_load_over_gain=3.0)
    cached = {"a": PrefixMatch(8, 0)}
    # load_weight 0.2 x a gap of 1,000 = 200 tokens of load against a 128-token hit: the
    # cost moves it (200 > 128), the guard keeps it (200 <= 3 x 128)
    assert third_turn_goes_to(guard, {"a": 1000.0}, cached) == "a"
    # a gap of 2,000: 400 > 3 x 128 = 384: the guard lets the cost move it
    assert third_turn_goes_to(guard, {"a": 2000.0}, cached) == "b"
    # nothing cached on a (evicted): no hit to keep, the cost decides at any gap
    assert third_turn_goes_to(guard, {"a": 1.0}, {}) == "b"
    # b holds as much of it as a: no hit from staying either
    assert third_turn_goes_to(guard, {"a": 10.0}, {**cached, "b": PrefixMatch(8, 0)}) == "b"


def test_a_request_that_ran_elsewhere_takes_its_session_there():
    p = policy(OPEN)
    t1, t2, t3 = turns(0, 3)
    assert rank(p, "1", t1, {}) == "a"
    assert rank(p, "2", t2, {"b": 1.0}) == "a"
    p.moved(t2, "b")  # a was full: Serve sent it to b
    assert rank(p, "3", t3, busy("b")) == "b"
    p.continuations.check_invariants()


def test_the_router_tells_the_policy_where_a_moved_request_went():
    router = Router(RouterConfig(block_size=B, continuation_affinity=True), clock=FakeClock())
    t1, t2 = turns(0, 2)
    assert router.route("1", t1, B * len(t1), IDS, 0).replica_id == "a"
    assert router.route("2", t2, B * len(t2), IDS, 0).replica_id == "a"  # 1's pending marks
    router.move("2", "b")
    prompts = router.policy.continuations._prompts
    assert [(k, v.replica_id, v.turn) for k, v in prompts.items()] == [(t1[-1], "a", 1),
                                                                      (t2[-1], "b", 2)]
    router.check_invariants()


def test_memory_is_bounded_and_its_sums_hold_under_random_sessions():
    guard = ContinuationGuard(session_window=5, max_prompts=16)
    c = Continuations(guard)
    rng = random.Random(7)
    ids = ("a", "b", "c")
    grown = {s: 1 for s in range(40)}
    for _ in range(2000):
        session = rng.randrange(40)
        hashes = [h(1000 * session + i) for i in range(4 * grown[session])]
        grown[session] = grown[session] + 1 if rng.random() < 0.8 else 1  # or a new chat
        loads = [rng.choice((0.0, 100.0, 1e4)) for _ in ids]
        prefills = np.array([rng.choice((0.0, B * len(hashes))) for _ in ids])
        got = c.follow(hashes, B * len(hashes), ids, np.array(loads), rng.randrange(3),
                       prefills, 0.2)
        assert 0 <= got < 3
        if rng.random() < 0.1:
            c.moved(hashes, rng.choice(ids))
        c.check_invariants()
    assert len(c._prompts) == 16


@pytest.mark.parametrize("bad, match", [
    (dict(min_turns=1), "min_turns must be an integer >= 2"),
    (dict(load_over_mean=0.0), "load_over_mean must be > 0"),
    (dict(session_share=-1.0), "session_share must be > 0"),
    (dict(session_window=0), "session_window must be a positive integer"),
    (dict(max_prompts=0), "max_prompts must be a positive integer"),
    (dict(max_turn_blocks=0), "max_turn_blocks must be a positive integer"),
    (dict(max_load_over_gain=0.0), "max_load_over_gain must be > 0"),
])
def test_guard_refuses_bad_settings(bad, match):
    with pytest.raises(ValueError, match=match):
        ContinuationGuard(**bad)
