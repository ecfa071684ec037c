"""Several gateways, each blind to the others' decisions until events or shared marks
arrive: a fresh prefix on an idle fleet ties everywhere, and each gateway's tie must fall on
its own replica, not all on the first Serve lists. Real Serve types, no Ray cluster."""

import types

from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
from ray.serve._private.request_router.common import PendingRequest

from kv.hashing import block_hashes, namespace_root
from protocol.engine import EngineRequest, SamplingParams
from router.core.candidates import router_offset
from router.serve.request_router import ServeRequestRouter

DEPLOYMENT = DeploymentID(name="Engine", app_name="kvroute")
FLEET = [types.SimpleNamespace(replica_id=ReplicaID(n, DEPLOYMENT)) for n in "abcd"]


def gateway(gateway_id: str) -> ServeRequestRouter:
    router = ServeRequestRouter.__new__(ServeRequestRouter)
    router.initialize_state(model="tiny", router={"policy": "cache_aware", "block_size": 16},
                            gateway_id=gateway_id)
    router._started = router._pushing = True
    router.mirror.num_polls = 1  # no index actor here
    return router


async def choose(router: ServeRequestRouter, request_id: str,
                 fleet: list = FLEET) -> list[str]:
    tokens = list(range(3, 67))  # the same fresh prompt at every gateway
    call = EngineRequest(request_id, tokens, SamplingParams(max_tokens=8),
                         block_hashes=block_hashes(tokens, 16, namespace_root("tiny")))
    ranks = await router.choose_replicas(
        fleet, PendingRequest([call], {}, RequestMetadata(request_id, request_id)))
    return [r.replica_id.unique_id for [r] in ranks]


async def test_two_gateways_send_the_same_fresh_prefix_to_different_idle_replicas():
    assert (router_offset("gw-1") % 4, router_offset("gw-3") % 4) == (3, 2)
    one, three = gateway("gw-1"), gateway("gw-3")
    assert await choose(one, "q") == ["d", "a", "b", "c"]  # every replica ties: listed order
    assert await choose(three, "q") == ["c", "d", "a", "b"]


async def test_a_gateway_lists_from_its_offset_over_the_replicas_serve_lists_now():
    router = gateway("gw-1")
    assert router_offset("gw-1") % 3 == 2
    # "d" is gone (Serve no longer lists it): the list of three starts at its third
    assert await choose(router, "q", FLEET[:3]) == ["c", "a", "b"]
