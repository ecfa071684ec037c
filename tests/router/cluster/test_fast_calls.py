"""The index actor's per-request calls over ZMQ (router/cluster/fast_calls.py), on real
sockets on loopback: the same results and errors as through Ray, in the order sent, only
with the token, and a lost connection fails the calls in flight at once."""

import asyncio
import pickle
import threading

import pytest
import ray
import zmq

from kv.events import BlockStored, Cursor, EventBatch, EventLog
from protocol.engine import EngineStats
from router.cluster import index_actor
from router.cluster.actor_link import ActorLink
from router.cluster.fast_call_server import FastCallServer
from router.cluster.fast_calls import (
    FAST_METHODS,
    FastAddress,
    FastCallClient,
    FastCallConfig,
    FastHandle,
    ping,
    with_fast_calls,
)
from router.cluster.index_actor import IndexActorConfig, KVIndex, find_index
from router.cluster.index_mirror import IndexMirror
from router.cluster.packed_batches import PackedBatches
from router.cluster.poll_messages import PollRequest
from router.core.config import RouterConfig
from router.core.router import Router
from tests.router.cluster.test_mark_sharing import BLOCK_SIZE, LocalActor, route
from tests.router.cluster.test_packed_batches import h, mixed_batches
from tests.router.cluster.test_vllm_subscriber import until


class Target:
    def __init__(self):
        self.calls: list[tuple] = []
        self.release = asyncio.Event()

    def publish(self, x):
        self.calls.append(("publish", x))
        return x * 2

    def poll(self, x):  # called in order; its coroutine runs as a task, as Ray runs it
        self.calls.append(("poll", x))
        return self._poll(x)

    async def _poll(self, x):
        await self.release.wait()
        return ("polled", x)

    def share_marks(self, x):
        raise KeyError(x)

    def report_routes(self, *args):
        self.calls.append(("report_routes", args))


def serve(target) -> FastCallServer:
    return FastCallServer(target, FAST_METHODS, "127.0.0.1")


def silent_server() -> tuple[zmq.Socket, FastAddress]:
    """A ROUTER socket bound on loopback that takes connections and never answers."""
    socket = zmq.Context.instance().socket(zmq.ROUTER)
    socket.setsockopt(zmq.LINGER, 0)
    port = socket.bind_to_random_port("tcp://127.0.0.1")
    return socket, FastAddress(f"tcp://127.0.0.1:{port}", b"t" * 16)


async def test_calls_run_in_the_order_sent_and_return_what_the_method_did():
    target = Target()
    server = serve(target)
    client = FastCallClient(server.address())
    polled = asyncio.ensure_future(client.call("poll", 1))
    assert await client.call("publish", 21) == 42  # a waiting coroutine blocks nothing
    await client.call("report_routes", "a", ("b",))
    assert target.calls == [("poll", 1), ("publish", 21), ("report_routes", ("a", ("b",)))]
    target.release.set()
    assert await polled == ("polled", 1)
    with pytest.raises(KeyError):  # the method's own error, as Ray raises it
        await client.call("share_marks", "k")
    with pytest.raises(AttributeError, match="no fast call 'check_invariants'"):
        await client.call("check_invariants")
    assert server.num_calls == 5
    client.close()
    server.close()


async def test_a_first_call_made_before_the_connection_is_up_goes_once_it_is():
    """A new client's first call waits for the connection (nothing takes it before); the
    news that it is up may be read while the call waits, and must send it then."""
    target = Target()
    server = serve(target)
    for k in range(20):
        client = FastCallClient(server.address(), FastCallConfig(call_timeout_s=10.0))
        assert await client.call("publish", k) == 2 * k
        client.close()
    server.close()


async def test_a_handle_keeps_ray_where_nothing_answers_the_fast_calls():
    silent, address = silent_server()
    ray_handle = object()
    config = FastCallConfig(ping_timeout_s=0.3)
    assert not await asyncio.to_thread(ping, address, 0.3)
    assert await asyncio.to_thread(with_fast_calls, ray_handle, address, config) is ray_handle
    assert with_fast_calls(ray_handle, None) is ray_handle
    silent.close()
    server = serve(Target())
    fast = await asyncio.to_thread(with_fast_calls, ray_handle, server.address(), config)
    assert isinstance(fast, FastHandle) and fast.ray_handle is ray_handle
    fast.close()
    server.close()


async def test_a_failed_call_closes_the_fast_handle_and_finds_the_actor_again():
    servers = [serve(Target()), serve(Target())]
    found = iter([FastHandle(object(), FastCallClient(s.address())) for s in servers])
    link = ActorLink("test", lambda: next(found))
    assert await link.call(lambda index: index.publish.remote(1)) == 2
    first = link.found_handle
    with pytest.raises(KeyError):
        await link.call(lambda index: index.share_marks.remote(1))
    with pytest.raises(ConnectionError):  # closed with the handle it lost
        await first.client.call("publish", 1)
    assert await link.call(lambda index: index.publish.remote(2)) == 4
    assert link.found_handle is not first and servers[1].num_calls == 1
    link.found_handle.close()
    for server in servers:
        server.close()


async def test_two_routers_share_marks_and_poll_through_the_fast_calls():
    index = KVIndex()
    for rid in ("r0", "r1"):
        index.publish_snapshot(EventLog(rid, epoch="e0").snapshot([]))
    server = serve(index)
    mirrors = []
    for router_id in ("router-a", "router-b"):
        handle = FastHandle(LocalActor(index), FastCallClient(server.address()))
        mirror = IndexMirror(Router(RouterConfig(block_size=BLOCK_SIZE)), router_id,
                             threading.Lock(), index=handle)
        assert await mirror.sync_once()
        mirror.marks.start()
        mirrors.append(mirror)
    a, b = mirrors
    assert await a.sync_once() and not a.alone()
    assert route(a, "q1", ["r1", "r0"]) == "r1"
    await a.marks.drain()
    await b.sync_once()
    assert route(b, "q2", ["r0", "r1"]) == "r1"  # the mark a shared leads b to r1
    assert server.num_calls == 5  # 4 polls and a's marks: every call went over ZMQ
    for mirror in mirrors:
        mirror.stop()
        mirror._index.found_handle.close()
    server.close()


async def test_a_relays_packed_publish_goes_over_the_fast_calls_as_through_ray():
    """A relay's publish_packed (many replicas' batches, their stats) applies and answers
    over ZMQ as the actor's own method does: the stale replicas come back, the batches
    reach a poll."""
    direct, served = KVIndex(), KVIndex()
    for index in (direct, served):
        for rid in ("a", "b"):
            index.publish_snapshot(EventLog(rid, epoch=f"{rid}-0").snapshot(()))
    first, second, third = mixed_batches()
    late = EventBatch("b", "b-0", 5, (BlockStored((h(7),), None),))  # a gap: b must resync
    stats = {"a": EngineStats(1, 2, 3, 64, 10, 5, 0, 49, 0, 0)}
    server = serve(served)
    handle = FastHandle(object(), FastCallClient(server.address()))
    for batches in ([first, second, third], [late]):
        packed = PackedBatches.pack(batches)
        assert (await handle.publish_packed.remote(packed, stats)
                == direct.publish_packed(packed, stats))
    assert server.num_calls == 2  # both over ZMQ
    served.check_invariants()
    start = {"a": Cursor("a-0", 0), "b": Cursor("b-0", 0)}
    got = await handle.poll.remote(PollRequest("r", start, packed=True))
    want = await direct.poll(PollRequest("r", start, packed=True))
    assert got.packed.unpack() == want.packed.unpack() == [first, third, second]
    assert got.stats == want.stats
    handle.close()
    server.close()


@pytest.mark.slow
def test_the_index_actor_is_found_with_its_fast_calls_and_found_again_after_a_restart():
    ray.init(num_cpus=1, include_dashboard=False, object_store_memory=128 * 1024**2,
             log_to_driver=False, namespace="fast-calls-test")

    async def scenario():
        link = ActorLink("test", find_index)

        def poll(index):
            return index.poll.remote(PollRequest("router", {}))

        before = (await link.call(poll)).incarnation
        first = link.found_handle
        assert isinstance(first, FastHandle)
        ray.kill(first.ray_handle, no_restart=False)
        for _ in range(1000):  # until the connection's loss is seen: at once, no timeout
            try:
                await link.call(poll)
            except ConnectionError:
                break
            await asyncio.sleep(0.01)
        else:
            raise AssertionError("calls kept succeeding after the actor was killed")
        for _ in range(6000):  # found again once Ray restarted it
            try:
                after = (await link.call(poll)).incarnation
                break
            except ray.exceptions.RayError:  # restarting: not yet
                await asyncio.sleep(0.01)
        assert isinstance(link.found_handle, FastHandle) and link.found_handle is not first
        assert after != before
        assert link.found_handle.client.address != first.client.address
        link.found_handle.close()

    try:
        asyncio.run(scenario())
    finally:
        ray.shutdown()


def test_a_stalled_publish_is_found_again_well_before_its_replica_is_forgotten():
    config = FastCallConfig()
    assert config.call_timeout_s + config.ping_timeout_s <= IndexActorConfig().replica_timeout_s / 2


def test_an_index_actor_of_an_older_kvroute_is_called_through_ray(monkeypatch):
    class OldHandle:  # a Ray handle whose actor has no `fast_calls`
        pass

    old = OldHandle()
    monkeypatch.setattr(index_actor, "get_index_actor", lambda: old)
    assert find_index() is old


async def test_calls_without_a_handle_wait_for_one_find():
    server = serve(Target())
    address = server.address()
    finds = []

    def find():
        finds.append(1)
        return FastHandle(object(), FastCallClient(address))

    link = ActorLink("test", find)
    assert await asyncio.gather(*[link.call(lambda index, i=i: index.publish.remote(i))
                                  for i in range(5)]) == [0, 2, 4, 6, 8]
    assert len(finds) == 1
    link.found_handle.close()
    server.close()


async def test_a_failed_call_leaves_the_others_in_flight_their_replies():
    target = Target()
    server = serve(target)
    found = iter([FastHandle(object(), FastCallClient(server.address())) for _ in range(2)])
    link = ActorLink("test", lambda: next(found))
    polled = asyncio.ensure_future(link.call(lambda index: index.poll.remote(1)))
    await until(lambda: target.calls)  # the poll waits at the server
    first = link.found_handle
    with pytest.raises(KeyError):  # lost: the next call finds another handle
        await link.call(lambda index: index.share_marks.remote(1))
    assert await link.call(lambda index: index.publish.remote(1)) == 2
    second = link.found_handle
    assert second is not first
    target.release.set()
    assert await polled == ("polled", 1)  # as Ray's would, the poll kept its reply
    assert first.client._closed and not second.client._closed  # closed once idle
    assert await link.call(lambda index: index.publish.remote(2)) == 4
    second.close()
    server.close()


async def test_a_method_raising_stop_iteration_fails_its_call_and_no_other():
    class Odd(Target):
        def share_marks(self, x):
            raise StopIteration

    server = serve(Odd())
    client = FastCallClient(server.address())
    with pytest.raises(RuntimeError, match="StopIteration"):
        await client.call("share_marks", 1)
    assert await client.call("publish", 3) == 6
    client.close()
    client.close()  # twice: a no-op
    await asyncio.to_thread(client._watcher.join, 10.0)
    assert not client._watcher.is_alive()  # the monitor stopped, its watcher ended
    with pytest.raises(ConnectionError):  # a closed client makes no socket again
        client.call("publish", 1)
    server.close()


unpickled = []


def _record_unpickling():
    unpickled.append(1)
    return ()


class _Tripwire:
    def __reduce__(self):
        return (_record_unpickling, ())


async def test_a_request_without_the_token_is_dropped_unread():
    target = Target()
    server = serve(target)
    address = server.address()
    forged = FastCallClient(FastAddress(address.address, b"x" * 16),
                            FastCallConfig(call_timeout_s=0.5))
    with pytest.raises(asyncio.TimeoutError):
        await forged.call("publish", _Tripwire())
    client = FastCallClient(address)
    assert await client.call("publish", 2) == 4
    assert target.calls == [("publish", 2)] and server.num_calls == 1
    assert unpickled == []
    assert await client.call("publish", _Tripwire()) == ()  # with it, it is: () * 2
    assert unpickled == [1]
    forged.close()
    client.close()
    server.close()


async def test_a_goodbye_goes_the_way_the_publishes_went():
    index = KVIndex()
    server = serve(index)
    handle = FastHandle(LocalActor(index), FastCallClient(server.address()))
    await handle.publish.remote(EventBatch("r0", "e0", 0, ()), None)
    assert await handle.forget_replica.remote("r0") is True
    assert index.replica_ids() == [] and server.num_calls == 2
    handle.close()
    server.close()


async def test_an_argument_that_does_not_pickle_leaves_no_call_pending():
    server = serve(Target())
    client = FastCallClient(server.address())
    with pytest.raises((pickle.PicklingError, AttributeError)):  # a lambda: plain pickle
        client.call("publish", lambda: 1)
    assert not client._pending
    client.close_when_idle()
    assert client._closed
    server.close()


async def test_a_call_its_caller_gave_up_on_leaves_nothing_behind():
    """The outer timeout of a poll (index_mirror.py) cancels the reply it waits for: the
    call is no longer pending, and its timer goes with it."""
    socket, address = silent_server()
    client = FastCallClient(address, FastCallConfig(call_timeout_s=60.0))
    with pytest.raises(asyncio.TimeoutError):
        await asyncio.wait_for(client.call("poll", 1), 0.2)
    await asyncio.sleep(0)  # the reply's done callbacks run
    assert not client._pending and not client._unsent
    assert not [t for t in asyncio.get_running_loop()._scheduled if not t.cancelled()
                and t.when() > asyncio.get_running_loop().time() + 30]
    client.close()
    socket.close()
