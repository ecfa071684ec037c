"""The Serve request router's bookkeeping: an attempt Serve rejects or
abandons must not leave outstanding load or held pending marks behind. Real Serve types,
no Ray cluster: the hooks are driven in the order Serve calls them."""

import asyncio
import types

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineRequest, SamplingParams
from router.core.ledger import RouteKind, RouteState
from router.serve.request_router import ServeRequestRouter

DEPLOYMENT = DeploymentID(name="Engine", app_name="kvroute")


def make_router(now: list[float] | None = None) -> ServeRequestRouter:
    """`now`: the router's clock (monotonic seconds), moved by the test."""
    router = ServeRequestRouter.__new__(ServeRequestRouter)
    clock = {"clock": lambda: now[0]} if now is not None else {}
    router.initialize_state(model="tiny", router={"block_size": 16}, **clock)
    router.candidate_offset = 0  # lists the replicas as given: the ties these tests assert
    router._started = router._pushing = True  # no index actor here: polls and pushes stay off
    router.mirror.num_polls = 1  # and decisions do not wait for a first poll
    return router


def replica(name: str):
    return types.SimpleNamespace(replica_id=ReplicaID(name, DEPLOYMENT))


def pending(request_id: str) -> PendingRequest:
    tokens = list(range(3, 67))
    call = EngineRequest(request_id, tokens, SamplingParams(max_tokens=8),
                         block_hashes=block_hashes(tokens, 16, namespace_root("tiny")))
    return PendingRequest([call], {}, RequestMetadata(request_id, request_id))


def held_and_outstanding(router: ServeRequestRouter) -> tuple[int, int]:
    core = router.router
    return len(core.ledger), sum(core.loads.num_outstanding(r) for r in ("a", "b"))


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
    now = [1000.0]
    router = make_router(now)
    candidates = [replica("a"), replica("b")]
    [chosen], [_] = await router.choose_replicas(candidates, pending("gone"))
    assert held_and_outstanding(router) == (1, 1)
    router.on_request_completed(chosen.replica_id, "gone")  # never dispatched
    assert held_and_outstanding(router) == (0, 0)

    await router.choose_replicas(candidates, pending("silent"))
    await router.choose_replicas(candidates, pending("sent"))
    router.on_request_routed(pending("sent"), replica("a").replica_id, None)
    now[0] += 59.0  # a quiet router: far below the 1,024-decision trigger
    await router.choose_replicas(candidates, pending("next"))
    assert set(router.router.ledger) == {"silent", "sent", "next"}  # no sweep due yet
    now[0] += 2.0  # the first sweep is due, and "silent" was decided over 60 s ago
    await router.choose_replicas(candidates, pending("last"))
    # the dispatched call waits for its completion, however long it runs
    assert set(router.router.ledger) == {"sent", "next", "last"}
    assert router.router.loads._requests.keys() == {"sent", "next", "last"}


async def test_a_serve_call_is_recorded_as_a_call_and_dispatched_where_serve_sent_it():
    router = make_router()
    candidates = [replica("a"), replica("b")]
    await router.choose_replicas(candidates, pending("r1"))
    ledger = router.router.ledger
    assert (ledger.get("r1").kind, ledger.get("r1").state) == (RouteKind.CALL,
                                                                RouteState.ROUTED)
    router.on_request_routed(pending("r1"), replica("a").replica_id, None)
    assert ledger.get("r1").state is RouteState.DISPATCHED
    # a second dispatch hook (none comes from Serve) counts nothing twice
    router.on_request_routed(pending("r1"), replica("a").replica_id, None)
    requests = {s.labels["replica"]: s.value for m in router.metrics.registry.collect()
                if m.name == "kvroute_router_requests" for s in m.samples
                if s.name == "kvroute_router_requests_total"}
    assert requests == {"a": 1.0}


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


async def test_a_call_its_caller_gives_up_on_while_serve_routes_it_is_withdrawn_at_once():
    """Serve cancels the pending request's future and fires no hook (no completion without
    a replica): the decision's load and marks go then, not at the 60 s sweep."""
    router = make_router()
    candidates = [replica("a"), replica("b")]
    gone, served, sent = pending("gone"), pending("served"), pending("sent")
    for req in (gone, gone, served, sent):  # "gone" chosen twice: Serve backed off once
        await router.choose_replicas(candidates, req)
    router.on_request_routed(sent, replica("a").replica_id, None)
    served.future.set_result(candidates[0])  # fulfilled: its hooks will end it
    gone.future.cancel()
    sent.future.cancel()  # after its dispatch: its completion callback ends it
    await asyncio.sleep(0)
    assert set(router.router.ledger) == {"served", "sent"}
    assert router.router.loads._requests.keys() == {"served", "sent"}
    router.on_request_completed(replica("a").replica_id, "sent")
    router.on_request_completed(replica("a").replica_id, "served")
    assert held_and_outstanding(router) == (0, 0)
