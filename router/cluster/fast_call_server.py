"""The index actor's side of the fast calls (router/cluster/fast_calls.py): its methods
served on a ZMQ ROUTER socket of its own, in its event loop.

The socket is a plain one whose descriptor the loop watches, read and written with int
flags, as the callers' (fast_calls.py): zmq.asyncio's futures and the reader task they
wake cost the actor more than the calls it serves (`python benchmarks/bench_fast_calls.py`).
It takes one request a turn of the loop, so a flood on it, with the token or without, cannot
hold the actor's Ray calls and polls back."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import pickle
import secrets
from typing import Any

import zmq

from router.cluster.fast_calls import (
    _EVENTS,
    _NOBLOCK,
    _POLLIN,
    _RCVMORE,
    _SNDMORE,
    MAX_MESSAGE_BYTES,
    PING_METHOD,
    REPLY_ERR,
    REPLY_OK,
    FastAddress,
)


class FastCallServer:
    """Serves `methods` of `target` on a ROUTER socket bound to `host`, in the running
    event loop (the actor's: its Ray calls run there too, so the two never interleave
    within a plain method)."""

    def __init__(self, target: Any, methods: frozenset[str], host: str):
        self._target = target
        self._methods = methods
        self._host = host
        self._token = secrets.token_bytes(16)
        self._socket: zmq.Socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._address: FastAddress | None = None
        self._turn_due = False  # a take of the next request waits for the loop's next turn
        self._tasks: set[asyncio.Task] = set()  # coroutine calls
        self.num_calls = 0  # requests with the token, pings aside

    def address(self) -> FastAddress:
        """Binds and starts serving on the first ask (in the loop that serves)."""
        if self._address is None:
            socket = zmq.Context.instance().socket(zmq.ROUTER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            port = socket.bind_to_random_port(f"tcp://{self._host}")
            self._socket, self._loop = socket, asyncio.get_running_loop()
            self._address = FastAddress(f"tcp://{self._host}:{port}", self._token)
            # the descriptor's wake only books a turn: a take straight from it could serve a
            # second request in a turn that took one already, ahead of the task of a
            # coroutine call (`poll`) that request's caller made before it
            self._loop.add_reader(socket.getsockopt(zmq.FD), self._come_back)
            self._come_back()
        return self._address

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._socket is not None and not self._socket.closed:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._socket.getsockopt(zmq.FD))
            self._socket.close()

    def _take_one(self) -> None:
        """Serves the request waiting first, if any, and comes back for the next on the
        loop's next turn (whatever serving raised: the descriptor may not wake for those)."""
        self._turn_due = False
        socket = self._socket
        if socket.closed:
            return
        try:
            if socket.get(_EVENTS) & _POLLIN:
                frames = [socket.recv(_NOBLOCK)]
                while socket.get(_RCVMORE):
                    frames.append(socket.recv(_NOBLOCK))
                self._serve(frames)
        finally:
            self._come_back()

    def _come_back(self) -> None:
        """On the descriptor's wake, and after a read or a send (which may take in news that
        the descriptor then never signals): while a request waits, the loop's next turn
        takes it."""
        socket = self._socket
        if not self._turn_due and not socket.closed and socket.get(_EVENTS) & _POLLIN:
            self._turn_due = True
            self._loop.call_soon(self._take_one)

    def _serve(self, frames: list[bytes]) -> None:
        if len(frames) != 5 or not hmac.compare_digest(frames[2], self._token):
            return  # not one of ours: no reply, nothing unpickled
        peer, call_id, _, method, body = frames
        if method == PING_METHOD:
            self._send(peer, call_id, REPLY_OK, pickle.dumps(None))
            return
        self.num_calls += 1
        try:
            name = method.decode()
            if name not in self._methods:
                raise AttributeError(f"no fast call {name!r}")
            result = getattr(self._target, name)(*pickle.loads(body))
        except Exception as err:
            self._reply_error(peer, call_id, err)
            return
        if inspect.isawaitable(result):  # started now: a caller's calls run in its order
            task = self._loop.create_task(self._finish(peer, call_id, result))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
        else:
            self._reply(peer, call_id, result)

    async def _finish(self, peer: bytes, call_id: bytes, result) -> None:
        try:
            value = await result
        except Exception as err:
            self._reply_error(peer, call_id, err)
            return
        self._reply(peer, call_id, value)

    def _reply(self, peer: bytes, call_id: bytes, value: Any) -> None:
        try:
            body = pickle.dumps(value, protocol=5)
        except Exception as err:
            self._reply_error(peer, call_id, err)
            return
        self._send(peer, call_id, REPLY_OK, body)

    def _reply_error(self, peer: bytes, call_id: bytes, err: Exception) -> None:
        try:
            body = pickle.dumps(err)
        except Exception:  # an error that does not pickle still fails the call
            body = pickle.dumps(RuntimeError(repr(err)))
        self._send(peer, call_id, REPLY_ERR, body)

    def _send(self, peer: bytes, call_id: bytes, status: bytes, body: bytes) -> None:
        """A ROUTER socket's send never waits nor fails: libzmq drops a reply to a peer gone,
        or one whose queue is full, and its caller's call times out."""
        socket = self._socket
        if socket.closed:
            return
        socket.send(peer, _NOBLOCK | _SNDMORE)
        socket.send(call_id, _NOBLOCK | _SNDMORE)
        socket.send(status, _NOBLOCK | _SNDMORE)
        socket.send(body, _NOBLOCK, copy=False)
        self._come_back()
