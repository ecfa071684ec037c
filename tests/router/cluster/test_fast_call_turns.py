"""The fast-call server's turns of the actor's event loop: one request a turn however many
callers keep its socket busy, each caller's calls started in the order sent (a coroutine
call's task before its caller's next call), and a request waiting behind one whose serving
raised still served."""

import asyncio

import pytest
import zmq

from router.cluster.fast_call_server import FastCallServer
from router.cluster.fast_calls import FastCallClient, FastCallConfig
from tests.router.cluster.test_fast_calls import Target, serve

NUM_CALLERS = 8
CALLS_PER_CALLER = 64


class Recorder:
    """As the index actor: `poll` a coroutine function, whose body runs in its task."""

    def __init__(self):
        self.calls: list[tuple[int, int]] = []  # (caller, call number), as each starts

    async def poll(self, caller: int, call_num: int):
        self.calls.append((caller, call_num))

    def publish(self, caller: int, call_num: int):
        self.calls.append((caller, call_num))


async def test_a_flood_from_many_callers_is_taken_one_a_turn_of_the_loop():
    """The actor's other work (its Ray calls, its polls' wake-ups) runs between the requests
    of a flood, not after a share of it, however often the descriptor wakes meanwhile."""
    target = Recorder()
    server = serve(target)
    clients = [FastCallClient(server.address()) for _ in range(NUM_CALLERS)]
    for caller, client in enumerate(clients):
        await client.call("publish", caller, 0)  # connected
    num_calls = NUM_CALLERS * CALLS_PER_CALLER
    seen: list[int] = []

    async def tick():
        while len(target.calls) < NUM_CALLERS + num_calls:
            seen.append(len(target.calls))
            await asyncio.sleep(0)

    async def caller_flood(caller: int, client: FastCallClient):
        # bursts that keep coming while the last ones are read
        for start in range(0, CALLS_PER_CALLER, 16):
            await asyncio.gather(*[client.call("publish", caller, k)
                                   for k in range(start, start + 16)])

    ticker = asyncio.ensure_future(tick())
    await asyncio.gather(*[caller_flood(c, client) for c, client in enumerate(clients)])
    await ticker
    steps = [b - a for a, b in zip(seen, seen[1:])]
    assert max(steps) <= 1, steps  # one take a turn, however many wakes
    for client in clients:
        client.close()
    server.close()


async def test_each_callers_calls_start_in_the_order_sent_among_many_callers():
    """A caller's poll (a coroutine call: a task) starts before that caller's next call
    runs, as Ray runs one caller's calls, while other callers keep the socket busy."""
    target = Recorder()
    server = serve(target)
    clients = [FastCallClient(server.address()) for _ in range(NUM_CALLERS)]

    async def caller_rounds(caller: int, client: FastCallClient):
        for k in range(0, 100, 2):
            await asyncio.gather(client.call("poll", caller, k),
                                 client.call("publish", caller, k + 1))

    await asyncio.gather(*[caller_rounds(c, client) for c, client in enumerate(clients)])
    for caller in range(NUM_CALLERS):
        assert [k for c, k in target.calls if c == caller] == list(range(100))
    for client in clients:
        client.close()
    server.close()


class Unreportable(Exception):
    """An error that neither pickles nor reprs: its reply cannot even be made."""

    def __reduce__(self):
        raise TypeError("does not pickle")

    def __repr__(self):
        raise TypeError("does not repr")


async def test_a_request_behind_one_whose_serving_raised_is_still_served():
    class Failing(Target):
        server: FastCallServer | None = None

        def share_marks(self, x):
            # until the next request waits in the socket: this read takes in the news
            # of it, which the descriptor then never signals
            assert self.server._socket.poll(10_000) == zmq.POLLIN
            raise Unreportable()

    target = Failing()
    server = target.server = serve(target)
    client = FastCallClient(server.address(), FastCallConfig(call_timeout_s=5.0))
    assert await client.call("publish", 0) == 0  # connected
    failed = client.call("share_marks", 1, timeout_s=0.5)
    published = client.call("publish", 2)
    assert await published == 4
    with pytest.raises(TimeoutError):  # no reply could be made for it
        await failed
    client.close()
    server.close()
