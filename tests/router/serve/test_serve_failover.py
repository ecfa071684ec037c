"""Index convergence and failure handling on real Ray (Serve with the simulated executor).

- events dropped, reordered and duplicated on the way to the real index actor, a replica
  restart (new epoch) and a restarted router: every router mirror ends equal to the engine;
- the index actor unreachable: approximate mode, then recovery;
- two gateway processes converge to the replicas' true contents; round_robin spreads;
- a replica killed under load: each request completes or fails clearly, none hangs; the
  index forgets it; its replacement joins and gets traffic.
"""

import concurrent.futures
import json

import httpx
import pytest
import ray
from ray import serve

from kv.events import contents_digest
from protocol.engine import EngineRequest, ReplicaQuery, SamplingParams
from router.cli import APP_NAME
from router.cluster.index_actor import INDEX_ACTOR_NAME, IndexActor
from router.cluster.index_mirror import IndexMirror
from router.core.router import Router, RouterConfig
from router.serve.publisher import ReplicaPublisher
from tests.router.serve.serve_helpers import kvroute_server, wait_until
from worker.engine.config import EngineConfig
from worker.engine.engine import Engine
from worker.openai.streaming import lost

pytestmark = pytest.mark.slow

SHARED = "Shared system prompt of the failover tests. " * 6
MAX_TOKENS = 400  # ~3 s of simulated decoding: long enough to kill a replica mid-way


@pytest.fixture(scope="module")
def server():
    args = {"model": "tiny", "replicas": 2, "engine": "sim", "policy": "round_robin",
            "gateways": 2, "num_blocks": 128, "cpus_per_rank": 0.5}
    with kvroute_server(args) as srv:
        yield srv


# ---- the index protocol over real actors, with a lossy link ----


class _Method:
    def __init__(self, fn):
        self.remote = fn


class LossyLink:
    """The index actor behind a link that drops, delays (reorders) or duplicates publishes,
    following `fates` in order (then delivers everything)."""

    def __init__(self, actor, fates: list[str]):
        self._actor = actor
        self._fates = iter(fates)
        self._delayed: list = []
        self.publish = _Method(self._publish)
        self.publish_snapshot = actor.publish_snapshot
        self.forget_replica = actor.forget_replica

    async def _publish(self, batch, stats, *rest):
        fate = next(self._fates, "deliver")
        if fate == "drop":
            return False
        if fate == "delay":
            self._delayed.append(batch)
            return False
        needs_snapshot = await self._actor.publish.remote(batch, stats, *rest)
        for late in self._delayed:  # arrives after a newer batch: reordered
            needs_snapshot |= await self._actor.publish.remote(late, stats, *rest)
        self._delayed.clear()
        if fate == "dup":
            needs_snapshot |= await self._actor.publish.remote(batch, stats, *rest)
        return needs_snapshot


def _engine(replica_id: str) -> Engine:
    return Engine.from_config(EngineConfig(model="tiny", engine="sim", sim_preset="tiny",
                                           replica_id=replica_id, num_blocks=40))


async def _run(engine: Engine, prompt_ids: list[int], request_id: str) -> None:
    request = EngineRequest(request_id, prompt_ids, SamplingParams(max_tokens=2, temperature=0))
    async for _ in engine.generate(request):
        pass


def _mirror(actor, name: str) -> tuple[Router, IndexMirror]:
    import threading

    router = Router(RouterConfig(policy="cache_aware", block_size=16))
    return router, IndexMirror(router, name, threading.RLock(), index=actor)


def _prompts(seed: int, n: int) -> list[list[int]]:
    import random

    rng = random.Random(seed)
    heads = [[rng.randrange(256) for _ in range(64)] for _ in range(3)]
    return [heads[i % 3] + [rng.randrange(256) for _ in range(rng.randrange(20, 120))]
            for i in range(n)]


async def test_index_converges_after_lost_reordered_events_and_restarts(server):
    actor = IndexActor.remote()  # a private instance, next to the app's named one
    fates = ["deliver", "drop", "deliver", "delay", "deliver", "dup", "drop", "delay",
             "delay", "deliver", "drop", "deliver", "delay", "dup", "deliver"]
    link = LossyLink(actor, fates)
    engine = _engine("lossy-0")
    publisher = ReplicaPublisher(engine, lambda: link)
    (router_a, mirror_a), (router_b, mirror_b) = _mirror(actor, "a"), _mirror(actor, "b")
    await publisher.publish_once()
    for i, prompt in enumerate(_prompts(0, 24)):  # 40 blocks: evictions happen too
        await _run(engine, prompt, f"r{i}")
        await publisher.publish_once()
        await (mirror_a if i % 2 else mirror_b).poll_once()
    await publisher.publish_once()  # the next heartbeat reveals any trailing gap

    async def converged(*routers_and_mirrors) -> None:
        truth = engine.snapshot()
        assert truth.device_hashes, "the engine holds blocks"
        for router, mirror in routers_and_mirrors:
            await mirror.poll_once()
            assert router.index.blocks_of("lossy-0", "device") == truth.device_hashes
        digests = await actor.replica_digests.remote()
        assert digests["lossy-0"] == contents_digest(truth.device_hashes, truth.host_hashes)

    await converged((router_a, mirror_a), (router_b, mirror_b))
    assert publisher.num_snapshots_sent >= 2  # the drops were recovered by snapshots

    # The replica restarts: same id, new epoch, empty cache.
    await engine.shutdown()
    engine = _engine("lossy-0")
    publisher = ReplicaPublisher(engine, lambda: link)
    await publisher.publish_once()
    for i, prompt in enumerate(_prompts(1, 3)):
        await _run(engine, prompt, f"s{i}")
        await publisher.publish_once()
    # ... and a router restarts: it starts from snapshots, not from an empty index.
    router_c, mirror_c = _mirror(actor, "c")
    await converged((router_a, mirror_a), (router_b, mirror_b), (router_c, mirror_c))
    await engine.shutdown()
    ray.kill(actor)


async def test_router_falls_back_while_the_index_actor_is_unreachable(server):
    dead = IndexActor.remote()
    ray.kill(dead)
    router, mirror = _mirror(dead, "fallback-test")
    assert await mirror.sync_once() is False
    assert mirror.fallback_reason == "index_unreachable" and router.approximate
    assert await mirror.sync_once() is True  # found again by name: the app's live actor
    assert mirror.fallback_reason is None and not router.approximate


# ---- the served app ----


def _complete(server, prompt: str, max_tokens: int = 4, stream: bool = False) -> dict:
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens, "stream": stream,
            "ignore_eos": True, "stream_options": {"include_usage": True} if stream else None}
    with server.client(timeout=60) as http:
        if not stream:
            resp = http.post("/v1/completions", json=body)
            return {"status": resp.status_code, "body": resp.json()}
        with http.stream("POST", "/v1/completions", json=body) as resp:
            if resp.status_code != 200:
                return {"status": resp.status_code, "body": json.loads(resp.read())}
            events = [line.removeprefix("data: ") for line in resp.iter_lines()
                      if line.startswith("data: ")]
        return {"status": 200, "events": events}


def _router_counts(server) -> dict[tuple[str, str], float]:
    out: dict[tuple[str, str], float] = {}
    for (name, labels), value in server.metrics().items():
        if name == "kvroute_router_requests_total":
            d = dict(labels)
            out[(d["gateway"], d["replica"])] = value
    return out


def test_round_robin_spreads_a_shared_prefix(server):
    before = _router_counts(server)
    for i in range(8):
        assert _complete(server, SHARED + f"q{i}")["status"] == 200
    # The other gateway's series arrive with its next push.
    after = wait_until(lambda: (lambda c: c if sum(c.values()) - sum(before.values()) == 8
                                else None)(_router_counts(server)), 10, "router counters")
    per_gateway: dict[str, list[float]] = {}
    for (gateway, _replica), value in after.items():
        per_gateway.setdefault(gateway, []).append(value - before.get((gateway, _replica), 0))
    assert sum(sum(v) for v in per_gateway.values()) == 8
    for counts in per_gateway.values():  # each gateway alternates between the replicas
        assert max(counts) - min(counts) <= 1


def _truth(replica_ids: list[str]) -> dict:
    handle = serve.get_deployment_handle("EngineReplica", app_name=APP_NAME)
    return {rid: handle.cache_digest.remote(ReplicaQuery(rid)).result(timeout_s=30)
            for rid in replica_ids}


def _call(method):
    """An index actor call, or None while the actor restarts."""
    try:
        return ray.get(method.remote(), timeout=10)
    except ray.exceptions.RayError:
        return None


def test_two_gateways_and_the_index_converge_to_the_replicas_contents(server):
    for i in range(6):
        assert _complete(server, SHARED + f"converge {i}")["status"] == 200
    index = ray.get_actor(INDEX_ACTOR_NAME, namespace="kvroute")
    replica_ids = server.replica_ids()
    truth = _truth(replica_ids)
    assert all(d.num_device_blocks > 0 for d in truth.values())

    def views_match() -> bool:
        try:
            views = ray.get(index.router_views.remote())
            digests = ray.get(index.replica_digests.remote())
        except ray.exceptions.RayError:  # the actor is restarting
            return False
        gateways = [v for rid, v in views.items() if not rid.startswith("pid-")]
        return (digests == truth and len(gateways) == 2
                and all(v == truth for v in views.values()))

    wait_until(views_match, 30, "both gateways' index mirrors to equal the replicas")

    # The index actor dies and is restarted by Ray: it rebuilds from the replicas'
    # snapshots, and the routers' mirrors converge again.
    before = ray.get(index.get_incarnation.remote())
    ray.kill(index, no_restart=False)
    wait_until(lambda: _call(index.get_incarnation) not in (None, before), 60,
               "Ray to restart the index actor")
    wait_until(views_match, 60, "the mirrors to converge after an index actor restart")


def test_killed_replica_under_load(server):
    replica_ids = server.replica_ids()
    victim = replica_ids[0]
    prompts = [(SHARED + f"load {i}", i % 2 == 0) for i in range(10)]
    with concurrent.futures.ThreadPoolExecutor(len(prompts)) as pool:
        futures = [pool.submit(_complete, server, p, MAX_TOKENS, stream)
                   for p, stream in prompts]
        # Kill once requests are running on the victim.
        wait_until(lambda: server.sum_metric("kvroute_engine_requests", replica=victim,
                                             state="running") > 0, 30, "load on the victim")
        actor = ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{victim}",
                              namespace="serve")
        ray.kill(actor, no_restart=True)
        results = [f.result(timeout=90) for f in futures]  # none hangs

    num_ok = num_failed = 0
    for result in results:
        if result["status"] == 200 and "body" in result:  # non-streaming: complete
            assert result["body"]["usage"]["completion_tokens"] == MAX_TOKENS
            num_ok += 1
        elif result["status"] == 200:  # streaming: [DONE] or a clear error event
            events = result["events"]
            if events[-1] == "[DONE]":
                assert json.loads(events[-2])["usage"]["completion_tokens"] == MAX_TOKENS
                num_ok += 1
            else:
                error = json.loads(events[-1])["error"]
                # a stable error naming no host, pid or actor (Ray's text is logged only)
                assert error == lost().body()["error"]
                num_failed += 1
        else:  # refused before streaming: a clear 503
            assert result["status"] == 503
            assert result["body"]["error"]["code"] == "replica_unavailable"
            num_failed += 1
    assert num_ok + num_failed == len(prompts)
    assert num_ok >= len(prompts) // 2  # the survivor's and the retried ones completed

    index = ray.get_actor(INDEX_ACTOR_NAME, namespace="kvroute")
    def forgotten() -> bool:
        replica_ids, views = _call(index.replica_ids), _call(index.router_views)
        return (replica_ids is not None and views is not None and victim not in replica_ids
                and all(victim not in view for view in views.values()))

    wait_until(forgotten, 30, f"the index and every router to forget {victim}")

    new_ids = wait_until(lambda: (lambda ids: ids if len(ids) == 2 and victim not in ids
                                  else None)(server.replica_ids()),
                         120, "Serve to start a replacement replica")
    (newcomer,) = set(new_ids) - set(replica_ids)
    # It publishes from its constructor; Serve routes to it once it is running, which both
    # gateways' routers show by exporting its series.
    survivor = replica_ids[1]

    def every_router_routes_to_newcomer() -> bool:
        # Both gateways, and any other process whose router exports series (the test
        # process's own handle, when an earlier test used one), see it like the survivor.
        up = server.by_label("kvroute_router_replica_up", "gateway", replica=newcomer)
        survivor_up = server.by_label("kvroute_router_replica_up", "gateway",
                                      replica=survivor)
        return len(up) >= 2 and set(survivor_up) <= set(up)

    try:
        wait_until(every_router_routes_to_newcomer, 180,
                   "both gateways to route to the replacement replica")  # it loads first
    except AssertionError as err:  # say what each router routes to
        up = {r: server.by_label("kvroute_router_replica_up", "gateway", replica=r)
              for r in {victim, newcomer, *new_ids}}
        raise AssertionError(f"{err}; replica_up by replica and gateway: {up}; "
                             f"/ready: {server.replica_ids()}") from None
    for i in range(6):
        assert _complete(server, SHARED + f"after {i}")["status"] == 200
    wait_until(lambda: any(v > 0 for (g, r), v in _router_counts(server).items()
                           if r == newcomer), 10, "traffic on the replacement replica")
    assert httpx.get(f"{server.base_url}/ready", timeout=10).json()["ready"] is True


def test_a_pinned_prefix_is_warmed_again_when_its_replica_dies(server):
    auth = {"Authorization": "Bearer key-a"}
    system = "Pinned prompt that must outlive its replica. " * 4
    with server.client(headers=auth) as http:
        reg = http.post("/v1/prefixes", json={"name": "survivor", "prompt": system})
        assert reg.status_code == 200, reg.text
        victim, num_blocks = reg.json()["replica"], reg.json()["num_pinned_blocks"]
        actor = ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{victim}",
                              namespace="serve")
        ray.kill(actor, no_restart=True)

        def placed_elsewhere():
            (p,) = http.get("/v1/prefixes").json()["data"]
            return p if p["status"] == "pinned" and p["replica"] != victim else None

        info = wait_until(placed_elsewhere, 120, "the prefix to be pinned on another replica")
        assert info["num_pinned_blocks"] == num_blocks
        wait_until(lambda: server.sum_metric("kvroute_engine_kv_blocks", replica=info["replica"],
                                             state="pinned") == num_blocks,
                   30, "the new replica to report the pinned blocks")
        assert http.delete("/v1/prefixes/survivor").json()["deleted"] is True
        wait_until(lambda: server.sum_metric("kvroute_engine_kv_blocks",
                                             replica=info["replica"], state="pinned") == 0,
                   30, "the new replica to unpin the deleted prefix")


def test_a_pinned_prefix_outlives_an_index_actor_restart(server):
    """The restarted actor has no records: the replica reports its pins with its first
    snapshot to it, the record is rebuilt (same replica, still pinned), and a delete then
    unpins it on the engine."""
    auth = {"Authorization": "Bearer key-a"}
    system = "Pinned prompt that must outlive the index actor. " * 4
    with server.client(headers=auth) as http:
        reg = http.post("/v1/prefixes", json={"name": "kept", "prompt": system})
        assert reg.status_code == 200, reg.text
        listed = reg.json()
        index = ray.get_actor(INDEX_ACTOR_NAME, namespace="kvroute")
        before = ray.get(index.get_incarnation.remote())
        ray.kill(index, no_restart=False)
        wait_until(lambda: _call(index.get_incarnation) not in (None, before), 60,
                   "Ray to restart the index actor")

        def listed_again():
            resp = http.get("/v1/prefixes")
            return resp.json()["data"] if resp.status_code == 200 else None

        assert wait_until(listed_again, 30, "the prefix to be listed again") == [listed]
        replica = listed["replica"]
        assert http.delete("/v1/prefixes/kept").json()["deleted"] is True
        wait_until(lambda: server.sum_metric("kvroute_engine_kv_blocks", replica=replica,
                                             state="pinned") == 0,
                   30, "the replica to unpin the deleted prefix")
        assert http.get("/v1/prefixes").json()["data"] == []
