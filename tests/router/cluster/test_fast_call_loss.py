"""A fast-calls client that loses its server: the calls in flight and every later one fail
at once, and its socket closes (no reconnects for the life of the process), whether its
event loop still runs or ended before the loss."""

import asyncio

import pytest

from router.cluster.fast_calls import FastCallClient, FastCallConfig
from tests.router.cluster.test_fast_calls import Target, serve, silent_server
from tests.router.cluster.test_vllm_subscriber import until


async def test_a_lost_connection_fails_the_calls_in_flight_and_every_later_one():
    target = Target()
    server = serve(target)
    client = FastCallClient(server.address(), FastCallConfig(call_timeout_s=60.0))
    assert await client.call("publish", 1) == 2  # connected
    polled = asyncio.ensure_future(client.call("poll", 1))
    await until(lambda: len(target.calls) == 2)  # the poll reached the server, waits there
    server.close()  # the actor's process died: its end of the connection closes
    with pytest.raises(ConnectionError):  # at once, not after the call's timeout
        await asyncio.wait_for(polled, 30.0)
    with pytest.raises(ConnectionError):
        await client.call("publish", 1)
    # and it stops reconnecting: its socket closed, the monitor's thread ends
    await asyncio.to_thread(client._watcher.join, 10.0)
    assert not client._watcher.is_alive()
    client.close()


def test_a_client_left_open_by_its_ended_loop_stops_reconnecting_once_its_server_dies():
    """A loss first seen after the client's loop ended still closes its socket: left to
    reconnect, it would wake the monitor's thread ten times a second for good."""
    server, address = silent_server()

    async def connect_then_end() -> FastCallClient:
        client = FastCallClient(address, FastCallConfig(call_timeout_s=60.0))
        sent = asyncio.ensure_future(client.call("publish", 1))
        await until(lambda: server.poll(0))  # the call reached the server: connected
        sent.cancel()
        return client  # left open as its loop ends

    client = asyncio.run(connect_then_end())
    assert client._watcher.is_alive()
    server.close()  # the server dies after the client's loop is gone
    client._watcher.join(10.0)
    assert not client._watcher.is_alive()


async def test_a_server_gone_before_the_first_call_fails_it_at_once():
    gone = serve(Target())
    address = gone.address()
    gone.close()
    client = FastCallClient(address, FastCallConfig(call_timeout_s=60.0))
    with pytest.raises(ConnectionError):  # refused, not the call's timeout
        await asyncio.wait_for(client.call("publish", 1), 30.0)
    client.close()


def test_a_client_whose_loop_ended_leaves_zmq_working_for_the_next():
    """A client closed (or left open) as its event loop ends must not wedge libzmq's
    threads: the next client, on a new loop, still gets its replies and its close through."""
    async def one_round(close: bool) -> FastCallClient:
        server = serve(Target())
        client = FastCallClient(server.address())
        assert await client.call("publish", 1) == 2
        if close:
            client.close()
        server.close()  # the server dies after its client's loop is gone, or with it
        return client

    for i in range(6):
        asyncio.run(one_round(close=i % 2 == 0))
    last = asyncio.run(one_round(close=True))  # served, and its close carried out:
    last._watcher.join(10.0)
    assert not last._watcher.is_alive()  # libzmq stopped its monitor: nothing wedged
