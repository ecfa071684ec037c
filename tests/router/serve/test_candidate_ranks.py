"""Gateways whose id hashes start their lists of replicas on one replica: once the index
actor has told each its rank among the routers (with its poll), a fresh prefix on an idle
fleet, tied everywhere, falls on a different replica at each. Real Serve types, the index
actor's class in this process (no Ray cluster)."""

import types

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineRequest, SamplingParams
from router.cluster.index_actor import KVIndex
from router.core.candidates import RouterRank, router_offset
from router.serve.request_router import ServeRequestRouter
from tests.router.cluster.test_mark_sharing import LocalActor

DEPLOYMENT = DeploymentID(name="Engine", app_name="kvroute")
FLEET = [types.SimpleNamespace(replica_id=ReplicaID(n, DEPLOYMENT)) for n in "abcd"]
GATEWAY_IDS = ("gw-0", "gw-1", "gw-2")


def gateway(gateway_id: str, index: KVIndex) -> ServeRequestRouter:
    router = ServeRequestRouter.__new__(ServeRequestRouter)
    router.initialize_state(model="tiny", router={"policy": "cache_aware", "block_size": 16},
                            gateway_id=gateway_id)
    router._started = router._pushing = True  # polls are driven here, one at a time
    router.mirror._index._handle = LocalActor(index)
    return router


async def first_choice(router: ServeRequestRouter, request_id: str) -> str:
    tokens = list(range(3, 67))  # the same fresh prompt at every gateway
    call = EngineRequest(request_id, tokens, SamplingParams(max_tokens=8),
                         block_hashes=block_hashes(tokens, 16, namespace_root("tiny")))
    ranks = await router.choose_replicas(
        FLEET, PendingRequest([call], {}, RequestMetadata(request_id, request_id)))
    return ranks[0][0].replica_id.unique_id


async def test_gateways_whose_hashes_collide_tie_on_different_replicas_once_ranked():
    assert {router_offset(g) % 4 for g in GATEWAY_IDS} == {3}  # hashed: all start at "d"
    index = KVIndex()
    gateways = [gateway(g, index) for g in GATEWAY_IDS]
    for gw in gateways:  # the first polls, one after another: each knows those before it
        assert await gw.mirror.sync_once()
    assert [gw.mirror.router_rank for gw in gateways] == [
        RouterRank(0, 1), RouterRank(1, 2), RouterRank(2, 3)]
    for gw in gateways:
        assert await gw.mirror.sync_once()
    assert [gw.mirror.router_rank for gw in gateways] == [
        RouterRank(0, 3), RouterRank(1, 3), RouterRank(2, 3)]
    # rank i of 3 lists the 4 replicas from i x 4 // 3: "a", "b", "c"
    assert [await first_choice(gw, "q") for gw in gateways] == ["a", "b", "c"]
