"""The index actor's per-request calls over ZMQ, beside Ray.

A Ray actor call costs here about 0.9 ms of the actor's CPU and 0.8 ms of the caller's,
most of it Ray's task machinery whatever the call carries; on the default path a request
makes about six (its replica's publish and end report, its router's marks, the routers'
polls that these wake). The same call as a request and reply on a ZMQ socket costs 0.2 and
0.2 ms (`python benchmarks/bench_fast_calls.py`). So the actor also serves those four
calls, a replica's goodbye, and a relay's `publish_packed` (many replicas' batches in one
call: the fleet's publish path, benchmarks/bench_index_actor.py), as `FAST_METHODS` on a
ZMQ ROUTER socket of its own (fast_call_server.py): the same methods, the same arguments and
replies, pickled as Ray pickles them. Ray keeps every other call, the finding of the actor,
and its restarts. Here: the callers' side.

- Whoever finds the actor asks it for the socket's address and a token (`fast_calls`), and
  pings it from the finding thread: no answer within `ping_timeout_s` (say, a network
  policy that lets Ray's ports through and not this one) and the caller keeps Ray's handle.
- A request carries the token, and nothing is unpickled without it: the token goes only to
  whoever can call the actor through Ray anyway.
- Calls from one caller run in the order sent, as Ray runs one caller's calls: a plain
  method at once in the socket's loop, a coroutine method (`poll`) as a task started then.
- Every call has a timeout (a publish's well under the actor's `replica_timeout_s`: a
  replica whose calls stall is found again, on Ray if need be, before it is forgotten), and
  the connection's loss (the actor's process died, or was gone before it connected) fails the
  calls in flight at once. A failure loses the handle (actor_link.py): it closes once its
  calls in flight are done, and the next call finds the actor anew, at its new address.
- The server yields to the actor's loop between requests, so a flood on its socket, with the
  token or without, cannot starve the actor's Ray calls and polls.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import logging
import pickle
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any

import ray
import zmq
from zmq.utils.monitor import parse_monitor_message

log = logging.getLogger(__name__)

# `forget_replica` too: a replica's goodbye must not overtake its last publish
FAST_METHODS = frozenset({"poll", "publish", "publish_packed", "report_routes",
                          "share_marks", "forget_replica"})
MAX_MESSAGE_BYTES = 1 << 30  # a snapshot of millions of blocks fits
_monitor_ids = itertools.count()
PING_METHOD = b"ping"
REPLY_OK, REPLY_ERR = b"ok", b"err"
_NOBLOCK, _SNDMORE, _RCVMORE, _EVENTS, _POLLIN, _POLLOUT = map(int, (
    zmq.NOBLOCK, zmq.SNDMORE, zmq.RCVMORE, zmq.EVENTS, zmq.POLLIN, zmq.POLLOUT))


@dataclass(frozen=True)
class FastAddress:
    address: str  # tcp://host:port
    token: bytes


@dataclass(frozen=True)
class FastCallConfig:
    call_timeout_s: float = 3.0
    # a long poll's bound: its caller's own (wait + poll timeout, 1 + 5 s) comes first
    poll_timeout_s: float = 10.0
    ping_timeout_s: float = 2.0

    def __post_init__(self):
        for name in ("call_timeout_s", "poll_timeout_s", "ping_timeout_s"):
            if not getattr(self, name) > 0:
                raise ValueError(f"FastCallConfig: {name} must be > 0, got {getattr(self, name)}")


class FastCallClient:
    """One caller's DEALER socket to a `FastCallServer`, made on its first call in the event
    loop that calls it (every later call comes from that loop), which watches its descriptor
    (zmq.asyncio's futures cost a router's poll twice the CPU: bench_reply_cpu.py)."""

    def __init__(self, address: FastAddress, config: FastCallConfig | None = None):
        self.address = address
        self.config = config or FastCallConfig()
        self._ids = itertools.count()
        self._pending: dict[bytes, asyncio.Future] = {}
        self._unsent: dict[bytes, list] = {}  # call id -> its frames, until sent (in order)
        self._socket: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._watcher: threading.Thread | None = None  # reads the socket's monitor
        self._lost: Exception | None = None  # the connection's loss, once seen
        self._closing = False  # lost by its link: closes once its calls are done
        self._closed = False

    def call(self, method: str, *args: Any, timeout_s: float | None = None) -> Awaitable[Any]:
        """Sends `method(*args)` for the server's target now, as Ray's `.remote()` submits
        (so calls run in the order made), and returns what awaits its reply: what the
        method returned or raised, ConnectionError once the connection was lost,
        TimeoutError after `timeout_s` (default `call_timeout_s`)."""
        self._connect()
        reply = self._loop.create_future()
        if self._lost is not None:
            reply.set_exception(self._lost)
            return reply
        body = pickle.dumps(args, protocol=5)  # raises here, before the call is pending
        call_id = next(self._ids).to_bytes(8, "little")
        self._pending[call_id] = reply
        self._unsent[call_id] = [call_id, self.address.token, method.encode(), body]
        # the reply itself, its timeout a timer: no task a call (a router polls a request)
        timer = self._loop.call_later(timeout_s or self.config.call_timeout_s,
                                      self._time_out, call_id, reply)
        reply.add_done_callback(functools.partial(self._done, call_id, timer))
        self._on_events()
        return reply

    def _time_out(self, call_id: bytes, reply: asyncio.Future) -> None:
        self._unsent.pop(call_id, None)  # a send still queued never leaves
        if not reply.done():
            reply.set_exception(TimeoutError(f"fast call to {self.address.address}: no reply"))

    def _done(self, call_id: bytes, timer: asyncio.TimerHandle, _: asyncio.Future) -> None:
        """A reply, its timeout, the connection's loss, or its caller giving up (cancelled)."""
        timer.cancel()
        self._unsent.pop(call_id, None)
        self._pending.pop(call_id, None)
        if self._closing and not self._pending:
            self.close()

    def close_when_idle(self) -> None:
        """Closes now if no call is in flight, else once the last one is done (a lost
        handle's other calls keep their replies, as Ray's would)."""
        self._closing = True
        if not self._pending:
            self.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._fail_all(ConnectionError(f"fast calls to {self.address.address} closed"))
        self._close_socket()

    def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise ConnectionError(f"fast calls to {self.address.address} closed")
        if self._socket is not None:
            if loop is not self._loop:
                raise RuntimeError("a FastCallClient is called from one event loop")
            return
        context = zmq.Context.instance()
        socket = context.socket(zmq.DEALER)
        socket.setsockopt(zmq.LINGER, 0)
        # a send waits for the connection, not in a queue that outlives it
        socket.setsockopt(zmq.IMMEDIATE, 1)
        # A connection dropped, or refused before it was ever made: the server is gone.
        # libzmq's sends to a monitor block until read, so a thread of its own reads it
        # until the socket's close stops it, whatever becomes of this event loop (a watcher
        # on the loop that ended with it wedged libzmq's threads for the whole process).
        endpoint = f"inproc://kvroute-fast-calls-monitor-{next(_monitor_ids)}"
        socket.monitor(endpoint, zmq.EVENT_DISCONNECTED | zmq.EVENT_CONNECT_RETRIED
                       | zmq.EVENT_MONITOR_STOPPED)
        monitor = context.socket(zmq.PAIR)
        monitor.connect(endpoint)
        self._watcher = threading.Thread(target=self._watch, args=(monitor, loop),
                                         daemon=True, name="kvroute-fast-calls-monitor")
        self._watcher.start()
        socket.connect(self.address.address)
        self._socket, self._loop = socket, loop
        loop.add_reader(socket.getsockopt(zmq.FD), self._on_events)

    def _on_events(self) -> None:
        """Sends the waiting calls in order and hands out the replies, until nothing moves:
        the descriptor wakes the loop only for news no send, receive or read took in."""
        socket = self._socket
        if socket is None or socket.closed:
            return
        unsent = self._unsent
        while True:
            while unsent:
                call_id = next(iter(unsent))
                *first, last = unsent[call_id]
                try:  # pyzmq's multipart wrappers' enum flags cost more than the sends
                    for frame in first:
                        socket.send(frame, _NOBLOCK | _SNDMORE, copy=False)
                except zmq.Again:  # no connection yet (then not even its first frame went)
                    break
                socket.send(last, _NOBLOCK, copy=False)
                del unsent[call_id]
            events = socket.get(_EVENTS)
            if events & _POLLIN:
                frames = [socket.recv(_NOBLOCK)]
                while socket.get(_RCVMORE):
                    frames.append(socket.recv(_NOBLOCK))
                self._deliver(frames)
            elif not (unsent and events & _POLLOUT):
                return

    def _deliver(self, frames: list[bytes]) -> None:
        reply = self._pending.pop(frames[0], None) if len(frames) == 3 else None
        if reply is None or reply.done():  # timed out meanwhile, or not a reply
            return
        try:
            value = pickle.loads(frames[2])
        except Exception as err:
            return reply.set_exception(err)
        if frames[1] == REPLY_OK:
            reply.set_result(value)
        elif isinstance(value, Exception) and not isinstance(value, StopIteration):
            reply.set_exception(value)
        else:  # a future takes no StopIteration (nor a non-exception)
            reply.set_exception(RuntimeError(repr(value)))

    def _watch(self, monitor: zmq.Socket, loop: asyncio.AbstractEventLoop) -> None:
        """In its own thread: reads the monitor until the socket closes; a loss fails calls."""
        lost = ConnectionError(f"fast calls to {self.address.address}: connection lost")
        try:
            while True:
                event = parse_monitor_message(monitor.recv_multipart())["event"]
                if event == zmq.EVENT_MONITOR_STOPPED:
                    return
                if event in (zmq.EVENT_DISCONNECTED, zmq.EVENT_CONNECT_RETRIED):
                    try:
                        loop.call_soon_threadsafe(self._lose, lost)
                    except RuntimeError:  # the loop is closed: no call is left to fail,
                        self._socket.close()  # none will use the socket: stop its reconnects
        finally:
            monitor.close()

    def _lose(self, err: Exception) -> None:
        """The connection is gone for good (a server back is found again through Ray, at a
        new address): fail the calls, stop the socket reconnecting (10 wakes a second)."""
        self._fail_all(err)
        self._close_socket()

    def _close_socket(self) -> None:
        if self._socket is not None and not self._socket.closed:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._socket.getsockopt(zmq.FD))
            self._socket.close()  # stops the monitor: its watcher thread then ends

    def _fail_all(self, err: Exception) -> None:
        self._lost = self._lost or err
        for reply in self._pending.values():
            if not reply.done():
                reply.set_exception(err)
        self._pending.clear()
        self._unsent.clear()


def ping(address: FastAddress, timeout_s: float) -> bool:
    """Whether the server answers within `timeout_s` (blocking: from a thread)."""
    socket = zmq.Context.instance().socket(zmq.DEALER)
    socket.setsockopt(zmq.LINGER, 0)
    try:
        socket.connect(address.address)
        socket.send_multipart([b"\0" * 8, address.token, PING_METHOD, b""])
        return bool(socket.poll(int(timeout_s * 1000))) and socket.recv_multipart()[1] == REPLY_OK
    finally:
        socket.close()


class FastHandle:
    """A Ray handle of the actor whose `FAST_METHODS` go through `client`:
    `handle.poll.remote(request)` is awaited as with Ray; every other attribute is Ray's."""

    def __init__(self, handle: Any, client: FastCallClient):
        self.ray_handle = handle
        self.client = client

    def __getattr__(self, name: str) -> Any:
        if name in FAST_METHODS:
            return _FastMethod(self.client, name)
        return getattr(self.ray_handle, name)

    def close(self) -> None:
        self.client.close()

    def close_when_idle(self) -> None:
        self.client.close_when_idle()


class _FastMethod:
    def __init__(self, client: FastCallClient, name: str):
        self._client, self._name = client, name

    def remote(self, *args: Any):
        timeout_s = self._client.config.poll_timeout_s if self._name == "poll" else None
        return self._client.call(self._name, *args, timeout_s=timeout_s)


def with_fast_calls(handle: Any, address: FastAddress | None,
                    config: FastCallConfig | None = None) -> Any:
    """`handle` with its fast calls on `address` if the server answers there; else
    `handle` itself (Ray for every call)."""
    config = config or FastCallConfig()
    if address is None:
        return handle
    if not ping(address, config.ping_timeout_s):
        log.warning("no answer from the index actor's fast calls at %s in %.1f s: "
                    "calling it through Ray", address.address, config.ping_timeout_s)
        return handle
    log.info("calling the index actor's per-request methods at %s", address.address)
    return FastHandle(handle, FastCallClient(address, config))


def reach_fast_calls(handle: Any, config: FastCallConfig | None = None,
                     timeout_s: float = 30.0) -> Any:
    """`handle` with its fast calls, at the address the actor gives (`with_fast_calls`).
    Blocking: call it from a thread. Raises what asking the actor raised (it is restarting,
    say): the caller finds it again later, rather than keeping Ray's handle for good."""
    try:
        fast_calls = handle.fast_calls
    except AttributeError:  # an actor of an older kvroute, still running: Ray only
        return handle
    return with_fast_calls(handle, ray.get(fast_calls.remote(), timeout=timeout_s), config)
