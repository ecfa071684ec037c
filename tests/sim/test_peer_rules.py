"""The simulator's other routing rules (benchmarks/peers/emulation.py): the peers'
cache_aware as documented, and kvroute's cost with continuation affinity and its guards."""

import pytest

from benchmarks.peers.emulation import (
    ContinuationAffinity,
    Guard,
    PeerCacheAware,
    install,
)
from benchmarks.peers.emulation import (
    rule as parse_rule,
)
from benchmarks.simlib import workloads as wl
from router.core.config import RouterConfig
from router.core.policies import ReplicaView, RouteQuery
from router.core.prefix_match import PrefixMatch
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
    rule = ContinuationAffinity(RouterConfig())
    first = blocks("p", 10)
    assert rule.rank(query("1", first, ("a", "b")), idle())[0] == "a"
    busy_a = ReplicaView({}, lambda rid: 1e6 if rid == "a" else 0.0)
    # on cost alone the next turn goes to b (nothing cached anywhere, a loaded) ...
    assert rule.inner.rank(query("x", first + blocks("r", 4), ("a", "b")), busy_a)[0] == "b"
    # ... but it extends the prompt routed to a
    assert rule.rank(query("2", first + blocks("r", 4), ("a", "b")), busy_a) == ["a", "b"]
    assert rule.num_kept == 1
    # the same prompt again extends nothing (its last block is the earlier prompt's last)
    assert rule.rank(query("3", first, ("a", "b")), busy_a)[0] == "b"


def loaded(a_tokens, matches=None):
    return ReplicaView(matches or {}, lambda rid: a_tokens if rid == "a" else 0.0)


def next_turn_goes_to(guard, a_tokens, matches=None):
    """Where the turn after a 10-block prompt (routed to a) goes, a carrying `a_tokens`."""
    policy = ContinuationAffinity(RouterConfig(), guard)
    first = blocks("p", 10)
    assert policy.rank(query("1", first, ("a", "b")), idle())[0] == "a"
    return policy.rank(query("2", first + blocks("r", 4), ("a", "b")),
                       loaded(a_tokens, matches))[0]


def test_a_load_guard_moves_the_turn_only_off_a_replica_far_above_the_mean():
    # a: 1,000 tokens, b: 0, mean 500: a is 2x the mean
    assert next_turn_goes_to(Guard(load_over_mean=2.5), 1000.0) == "a"
    assert next_turn_goes_to(Guard(load_over_mean=1.5), 1000.0) == "b"


def test_hysteresis_moves_the_turn_only_when_the_gain_exceeds_the_history_left_behind():
    held = {"a": PrefixMatch(10, 0)}  # the first prompt's 160 tokens cached on a
    # cost: a 64 + 0.2 x 1,000 = 264, b 224 (all uncached): a gain of 40 < 160 cached
    assert next_turn_goes_to(Guard(gain_over_history=1.0), 1000.0, held) == "a"
    # a gain of 0.2 x 10,000 - 160 = 1,840 > 160
    assert next_turn_goes_to(Guard(gain_over_history=1.0), 10_000.0, held) == "b"
    # nothing cached on a: any gain moves it
    assert next_turn_goes_to(Guard(gain_over_history=1.0), 1000.0) == "b"


def test_a_session_share_guard_moves_turns_off_a_replica_holding_most_recent_context():
    policy = ContinuationAffinity(RouterConfig(), Guard(session_share=1.5, session_window=2))
    ids = ("a", "b")
    busy_a, busy_b = loaded(1e6), ReplicaView({}, lambda rid: 1e6 if rid == "b" else 0.0)
    s1, s2, s3 = blocks("s", 10), blocks("t", 10), blocks("u", 10)
    for name, prompt in (("1", s1), ("2", s2)):
        assert policy.rank(query(name, prompt, ids), busy_b)[0] == "a"
    assert policy.session_tokens == {"a": 320.0}
    # s1's next turn: a holds s2's 160 tokens, b none: 2x the mean share, so it moves
    assert policy.rank(query("3", s1 + blocks("x", 2), ids), busy_a)[0] == "b"
    assert policy.session_tokens == {"a": 160.0, "b": 192.0}
    # s2's next turn: counted as itself no longer, a holds nothing: it stays
    assert policy.rank(query("4", s2 + blocks("y", 2), ids), busy_a)[0] == "a"
    assert policy.num_kept == 1
    assert policy.session_tokens == {"a": 192.0, "b": 192.0}
    # a third session on b; the window of 2 drops the oldest entry (s1's turn on b)
    assert policy.rank(query("5", s3, ids), busy_a)[0] == "b"
    assert policy.session_tokens == {"a": 192.0, "b": 160.0}


def test_rule_names_a_guard_and_refuses_bad_ones():
    make = parse_rule("continuation_affinity:load_over_mean=1.2,session_window=32")
    policy = make(RouterConfig())
    assert policy.guard == Guard(load_over_mean=1.2, session_window=32)
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
                      ("continuation_affinity", ContinuationAffinity)):
        sim = make_sim(work, num_replicas=2)
        install(sim, rule)
        assert all(type(router.policy) is cls for router in sim.routers)
        where: dict[str, set[str]] = {}
        for r in sim.run().records:
            where.setdefault(r.request_id.rsplit("-r", 1)[0], set()).add(r.replica_id)
        assert sorted(len(v) for v in where.values()) == [1, 1, 1, 1], rule
    with pytest.raises(ValueError, match="unknown rule"):
        install(make_sim(work), "nope")
