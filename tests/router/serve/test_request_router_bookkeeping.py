"""The Serve request router's bookkeeping: an attempt Serve rejects or
abandons must not leave outstanding load or held pending marks behind. Real Serve types,
no Ray cluster: the hooks are driven in the order Serve calls them."""

import types

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from router.serve.request_router import KVRouteRequestRouter
from worker.api import EngineRequest, SamplingParams

DEPLOYMENT = DeploymentID(name="Engine", app_name="kvroute")


def make_router() -> KVRouteRequestRouter:
    router = KVRouteRequestRouter.__new__(KVRouteRequestRouter)
    router.initialize_state(model="tiny", router={"block_size": 16})
    router._started = True  # no index actor here: polls and pushes stay off
    router.mirror.num_polls = 1  # and decisions do not wait for a first poll
    return router


def replica(name: str):
    return types.SimpleNamespace(replica_id=ReplicaID(name, DEPLOYMENT))


def pending(request_id: str) -> PendingRequest:
    tokens = list(range(3, 67))
    call = EngineRequest(request_id, tokens, SamplingParams(max_tokens=8),
                         block_hashes=block_hashes(tokens, 16, namespace_root("tiny")))
    return PendingRequest([call], {}, RequestMetadata(request_id, request_id))


def held_and_outstanding(router: KVRouteRequestRouter) -> tuple[int, int]:
    core = router.router
    return len(core._held), sum(core.loads.num_outstanding(r) for r in ("a", "b"))


async def test_a_rejected_attempt_then_its_retry_leaves_nothing_behind():
    router = make_router()
    candidates = [replica("a"), replica("b")]
    req = pending("req-1")
    [first], [_] = await router.choose_replicas(candidates, req)
    # Serve retries (the replica rejected the first attempt) and the first attempt's
    # completion arrives after the retry's decision.
    [second], [_] = await router.choose_replicas(candidates, req)
    router.on_request_completed(first.replica_id, "req-1")
    router.on_request_routed(req, second.replica_id, None)
    router.on_request_completed(second.replica_id, "req-1")
    assert held_and_outstanding(router) == (0, 0)


async def test_an_abandoned_decision_is_released_by_its_completion_or_the_sweep():
    router = make_router()
    candidates = [replica("a"), replica("b")]
    [chosen], [_] = await router.choose_replicas(candidates, pending("gone"))
    assert held_and_outstanding(router) == (1, 1)
    router.on_request_completed(chosen.replica_id, "gone")  # never dispatched
    assert held_and_outstanding(router) == (0, 0)

    await router.choose_replicas(candidates, pending("silent"))
    entry = router._decisions["silent"]
    router._decisions["silent"] = entry[:3] + (entry[3] - 3600.0,)  # decided an hour ago
    router._next_sweep_s = 0.0  # a quiet router: far below the 1,024-decision trigger
    await router.choose_replicas(candidates, pending("next"))
    assert "silent" not in router._decisions and router.router.loads._requests.keys() == {
        "next"}


async def test_every_candidate_is_a_rank_and_a_spilled_request_moves_its_record():
    router = make_router()
    candidates = [replica("a"), replica("b"), replica("c")]
    ranks = await router.choose_replicas(candidates, pending("r1"))
    # cache_aware, all cold and idle: listed order
    assert [[r.replica_id.unique_id for r in rank] for rank in ranks] == [["a"], ["b"], ["c"]]
    router.on_request_routed(pending("r1"), ranks[0][0].replica_id, None)
    # the same prompt again ranks a first (r1's marks there); a is full, Serve sends it to b
    ranks = await router.choose_replicas(candidates, pending("r2"))
    assert [rank[0].replica_id.unique_id for rank in ranks] == ["a", "b", "c"]
    router.on_request_routed(pending("r2"), ranks[1][0].replica_id, None)
    core = router.router
    assert [core.loads.num_outstanding(r) for r in ("a", "b", "c")] == [1, 1, 0]
    assert core.index.pending_blocks("b") == frozenset(pending("r2").args[0].block_hashes)
    router.on_request_completed(ranks[1][0].replica_id, "r2")
    router.on_request_completed(ranks[0][0].replica_id, "r1")
    assert held_and_outstanding(router) == (0, 0)
