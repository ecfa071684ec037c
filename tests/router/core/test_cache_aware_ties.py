"""cache_aware's last tie-break: the work it has routed to each replica so far."""

from router.core.config import RouterConfig
from router.core.index import PrefixMatch
from router.core.policies import ReplicaView, RouteQuery, make_policy

REPLICAS = ["r0", "r1", "r2"]


def choose(p, request_id, num_tokens, max_tokens=0, matches=None, loads=None):
    loads = loads or {}
    q = RouteQuery(request_id, [], num_tokens, max_tokens, REPLICAS)
    return p.choose(q, ReplicaView(matches or {}, lambda rid: loads.get(rid, 0.0)))


def policy(**kw):
    return make_policy("cache_aware", RouterConfig(policy="cache_aware", **kw))


def test_idle_replicas_take_new_prefixes_in_turn_by_work_routed():
    p = policy()
    # All idle, nothing cached: every request ties; each goes where the least work went.
    assert [choose(p, f"q{i}", 100) for i in range(3)] == ["r0", "r1", "r2"]
    assert choose(p, "big", 1000, max_tokens=500) == "r0"  # r0 now has 1,600 routed
    assert [choose(p, f"s{i}", 100) for i in range(3)] == ["r1", "r2", "r1"]


def test_cost_and_load_still_come_first():
    p = policy(load_weight=0.5)
    for i in range(3):  # r0, r1, r2 get 100 each
        choose(p, f"q{i}", 100)
    choose(p, "heavy", 5000)  # r0: the tie-break's first pick
    # A cache hit on r0 still wins although r0 has the most routed work.
    assert choose(p, "hit", 160, matches={"r0": PrefixMatch(10, 0)}) == "r0"
    # Equal cost (load_weight 0), less load wins before routed work is looked at.
    p0 = policy(load_weight=0.0)
    assert choose(p0, "a", 100) == "r0"
    assert choose(p0, "b", 100, loads={"r1": 1.0, "r2": 1.0}) == "r0"


def test_the_guards_pick_is_charged_to_the_replica_it_sends_to():
    p = policy(load_weight=0.01, imbalance_threshold=1000.0)
    matches = {"r0": PrefixMatch(8, 0)}
    assert choose(p, "a", 128, matches=matches, loads={"r0": 1100.0}) == "r1"  # guard
    # r1 was charged 128 tokens: the next idle tie goes to r2, not r1.
    assert choose(p, "b", 50, loads={"r0": 1100.0}) == "r2"
