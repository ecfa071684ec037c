import pytest

from router.core.config import RouterConfig
from router.core.index import PrefixMatch
from router.core.policies import POLICY_NAMES, ReplicaView, RouteQuery, make_policy
from router.core.policies.cache_aware import CacheAwarePolicy
from tests.router.core.core_helpers import h

REPLICAS = ["r0", "r1", "r2"]


def query(num_blocks=8, replica_ids=REPLICAS, block_size=16, request_id="q"):
    hashes = [h(i) for i in range(num_blocks)]
    return RouteQuery(request_id, hashes, num_blocks * block_size, 0, list(replica_ids))


def view(matches=None, loads=None):
    loads = loads or {}
    return ReplicaView(matches or {}, lambda rid: loads.get(rid, 0.0))


def policy(name, **kw):
    return make_policy(name, RouterConfig(policy=name, **kw))


def test_factory_builds_every_policy_by_name_and_rejects_unknown():
    assert POLICY_NAMES == ("cache_aware", "round_robin", "least_load", "random",
                            "consistent_hash", "longest_prefix")
    for name in POLICY_NAMES:
        assert make_policy(name, RouterConfig()).name == name
    with pytest.raises(ValueError, match="unknown routing policy 'fastest'; choose one of "
                                         "cache_aware, round_robin"):
        make_policy("fastest", RouterConfig())


def test_round_robin_cycles_in_candidate_order():
    p = policy("round_robin")
    got = [p.choose(query(), view()) for _ in range(5)]
    assert got == ["r0", "r1", "r2", "r0", "r1"]
    assert p.choose(query(replica_ids=["r0", "r2"]), view()) == "r2"  # 6th call: 5 % 2 = 1


def test_least_load_picks_minimum_ties_to_first_listed():
    p = policy("least_load")
    assert p.choose(query(), view(loads={"r0": 5.0, "r1": 2.0, "r2": 2.0})) == "r1"
    assert p.choose(query(), view()) == "r0"


def test_random_is_seeded_and_stays_within_candidates():
    p, q = policy("random", seed=7), policy("random", seed=7)
    seq_p = [p.choose(query(), view()) for _ in range(30)]
    seq_q = [q.choose(query(), view()) for _ in range(30)]
    assert seq_p == seq_q
    assert set(seq_p) == set(REPLICAS)
    other = policy("random", seed=8)
    assert [other.choose(query(), view()) for _ in range(30)] != seq_p


def test_consistent_hash_moves_only_the_removed_replicas_keys():
    p = policy("consistent_hash", hash_prefix_blocks=2)
    replicas = [f"r{i}" for i in range(8)]

    def owner(key: int, candidates) -> str:
        q = RouteQuery("q", [h(1000 + key), h(key)], 32, 0, candidates)
        return p.choose(q, view())

    before = {k: owner(k, replicas) for k in range(400)}
    assert len(set(before.values())) == 8  # every replica owns some keys
    assert max(list(before.values()).count(r) for r in replicas) < 100  # fair-ish (50 each)
    after = {k: owner(k, [r for r in replicas if r != "r3"]) for k in range(400)}
    for k in before:
        if before[k] != "r3":
            assert after[k] == before[k], k
        else:
            assert after[k] != "r3"
    # the key is block hash_prefix_blocks - 1: later blocks do not matter, earlier do
    q1 = RouteQuery("q", [h(1), h(2), h(3)], 48, 0, replicas)
    q2 = RouteQuery("q", [h(9), h(2), h(4)], 48, 0, replicas)
    assert p.choose(q1, view()) == p.choose(q2, view())


def test_consistent_hash_without_full_block_keys_on_request_id():
    p = policy("consistent_hash")
    q = RouteQuery("req-17", [], 5, 0, REPLICAS)
    assert p.choose(q, view()) == p.choose(q, view())
    owners = {p.choose(RouteQuery(f"req-{i}", [], 5, 0, REPLICAS), view()) for i in range(30)}
    assert owners == set(REPLICAS)


def test_cache_aware_prefers_cache_until_load_outweighs_it():
    p = policy("cache_aware", load_weight=0.5)
    matches = {"r1": PrefixMatch(6, 0)}  # 96 of 128 tokens cached on r1
    assert p.choose(query(), view(matches)) == "r1"
    # cost r1 = 32 + 0.5 * 150 = 107 < cost r0 = 128
    assert p.choose(query(), view(matches, {"r1": 150.0})) == "r1"
    # cost r1 = 32 + 0.5 * 200 = 132 > 128: the first least-cost candidate, then r2
    assert p.choose(query(), view(matches, {"r1": 200.0})) == "r0"
    assert p.choose(query(), view(matches, {"r1": 200.0, "r0": 10.0})) == "r2"


def test_cache_aware_credits_host_blocks_below_device_blocks():
    p = policy("cache_aware", host_cost_fraction=0.2)
    assert isinstance(p, CacheAwarePolicy)
    assert p.prefill_cost_tokens(PrefixMatch(0, 4), 128) == pytest.approx(64 + 0.2 * 64)
    assert p.prefill_cost_tokens(PrefixMatch(2, 2), 128) == pytest.approx(64 + 0.2 * 32)
    assert p.prefill_cost_tokens(None, 128) == 128
    device, host = {"r2": PrefixMatch(4, 0)}, {"r1": PrefixMatch(0, 4)}
    assert p.choose(query(), view({**device, **host})) == "r2"  # device beats host
    assert p.choose(query(), view(host)) == "r1"  # host beats nothing
    # a longer host run beats a shorter device run: 0 + 0.2 * 128 < 64
    assert p.choose(query(), view({"r0": PrefixMatch(4, 0), "r1": PrefixMatch(0, 8)})) == "r1"


def test_cache_aware_imbalance_guard_sends_to_least_loaded_unless_cache_pays():
    # load_weight 0.01: the weighted load alone would keep the cached replica
    p = policy("cache_aware", load_weight=0.01, imbalance_threshold=1000.0)
    q = query(num_blocks=8)  # 128 tokens
    matches = {"r0": PrefixMatch(8, 0)}
    assert p.choose(q, view(matches, {"r0": 900.0})) == "r0"  # under the threshold
    assert p.choose(q, view(matches, {"r0": 1100.0})) == "r1"  # gap 1100 > 128 saved
    big = query(num_blocks=100)  # 1600 tokens, all cached on r0: saves more than the gap
    assert p.choose(big, view({"r0": PrefixMatch(100, 0)}, {"r0": 1100.0})) == "r0"


def test_longest_prefix_is_pure_greedy_ties_to_least_loaded():
    p = policy("longest_prefix")
    matches = {"r0": PrefixMatch(1, 0), "r2": PrefixMatch(0, 3)}
    assert p.choose(query(), view(matches, {"r2": 1e9})) == "r2"  # load ignored
    assert p.choose(query(), view({}, {"r0": 5.0, "r1": 1.0, "r2": 3.0})) == "r1"
