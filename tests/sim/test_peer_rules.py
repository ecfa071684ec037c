"""The simulator's other routing rules (benchmarks/peers/emulation.py): the peers'
cache_aware as documented, and kvroute's continuation affinity under other guards (the
guards themselves: tests/router/core/test_continuation.py)."""

import math

import pytest

from benchmarks.peers.emulation import (
    NO_GUARD,
    PeerCacheAware,
    continuation_affinity,
    install,
)
from benchmarks.peers.emulation import (
    rule as parse_rule,
)
from benchmarks.simlib import workloads as wl
from router.core.config import RouterConfig
from router.core.policies import ReplicaView, RouteQuery
from router.core.policies.cache_aware import CacheAwarePolicy
from router.core.policies.continuation import ContinuationGuard
from tests.sim.conftest import make_sim

IDS = ("a", "b", "c")


def query(name, hashes, replica_ids=IDS):
    return RouteQuery(name, hashes, 16 * len(hashes), 0, replica_ids)


def blocks(prefix, n):
    return [f"{prefix}{i}".encode() for i in range(n)]


def idle(matches=None):
    return ReplicaView(matches or {}, lambda rid: 0.0)


def test_the_peer_rule_follows_a_long_match_and_fills_the_emptiest_history():
    rule = PeerCacheAware(RouterConfig())
    first, other = blocks("p", 10), blocks("q", 4)
    assert rule.rank(query("1", first), idle())[0] == "a"  # nothing routed: listed order
    assert rule.rank(query("2", other), idle())[0] == "b"  # a holds 10 blocks, b none
    # the next turn: 10 of its 20 blocks were routed to a (50% > 30%)
    assert rule.rank(query("3", first + blocks("r", 10)), idle()) == ["a", "b", "c"]
    # 2 of 20 blocks (10%) is below the threshold: the emptiest history, c
    assert rule.rank(query("4", first[:2] + blocks("s", 18)), idle())[0] == "c"
    assert {rid: len(h) for rid, h in rule.routed.items()} == {"a": 20, "b": 4, "c": 20}


def test_continuation_affinity_keeps_the_next_turn_where_the_last_one_went():
    rule = continuation_affinity(RouterConfig())
    assert rule.continuations.guard == NO_GUARD
    first = blocks("p", 10)
    assert rule.rank(query("1", first, ("a", "b")), idle())[0] == "a"
    busy_a = ReplicaView({}, lambda rid: 1e6 if rid == "a" else 0.0)
    # on cost alone the next turn goes to b (nothing cached anywhere, a loaded) ...
    plain = CacheAwarePolicy(RouterConfig())
    assert plain.rank(query("x", first + blocks("r", 4), ("a", "b")), busy_a)[0] == "b"
    # ... but it extends the prompt routed to a
    assert rule.rank(query("2", first + blocks("r", 4), ("a", "b")), busy_a) == ["a", "b"]
    assert rule.continuations.num_kept == 1
    # the same prompt again extends nothing (its last block is the earlier prompt's last)
    assert rule.rank(query("3", first, ("a", "b")), busy_a)[0] == "b"


def test_rule_names_a_guard_and_refuses_bad_ones():
    make = parse_rule("continuation_affinity:load_over_mean=1.2,session_window=32,min_turns=3")
    policy = make(RouterConfig())
    assert policy.continuations.guard == ContinuationGuard(
        min_turns=3, load_over_mean=1.2, session_share=math.inf, session_window=32)
    assert parse_rule("peer_cache_aware") is PeerCacheAware
    for bad, match in (("continuation_affinity:nope=1", "want NAME=VALUE"),
                       ("continuation_affinity:load_over_mean=", "want NAME=VALUE"),
                       ("continuation_affinity:load_over_mean=0", "must be > 0"),
                       ("peer_cache_aware:load_over_mean=2", "only continuation_affinity"),
                       ("nope", "unknown rule")):
        with pytest.raises(ValueError, match=match):
            parse_rule(bad)


def test_install_routes_every_turn_of_a_client_to_one_replica():
    work = wl.multi_turn(num_clients=4, num_rounds=3, request_len=64, output_len=8,
                         rate_qps=50.0)
    for rule, cls in (("peer_cache_aware", PeerCacheAware),
                      ("continuation_affinity", CacheAwarePolicy)):
        sim = make_sim(work, num_replicas=2)
        install(sim, rule)
        assert all(type(router.policy) is cls for router in sim.routers)
        where: dict[str, set[str]] = {}
        for r in sim.run().records:
            where.setdefault(r.request_id.rsplit("-r", 1)[0], set()).add(r.replica_id)
        assert sorted(len(v) for v in where.values()) == [1, 1, 1, 1], rule
    with pytest.raises(ValueError, match="unknown rule"):
        install(make_sim(work), "nope")
