"""The index actor's side of the fast calls (router/cluster/fast_calls.py): its methods
served on a ZMQ ROUTER socket of its own, in its event loop."""

from __future__ import annotations

import asyncio
import hmac
import inspect
import pickle
import secrets
from typing import Any

import zmq
import zmq.asyncio

from router.cluster.fast_calls import (
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
        self._socket: zmq.asyncio.Socket | None = None
        self._address: FastAddress | None = None
        self._tasks: set[asyncio.Task] = set()  # the serving loop and coroutine calls
        self.num_calls = 0  # requests with the token, pings aside

    def address(self) -> FastAddress:
        """Binds and starts serving on the first ask."""
        if self._address is None:
            socket = zmq.asyncio.Context.instance().socket(zmq.ROUTER)
            socket.setsockopt(zmq.LINGER, 0)
            socket.setsockopt(zmq.MAXMSGSIZE, MAX_MESSAGE_BYTES)
            port = socket.bind_to_random_port(f"tcp://{self._host}")
            self._socket = socket
            self._address = FastAddress(f"tcp://{self._host}:{port}", self._token)
            self._spawn(self._serve())
        return self._address

    def close(self) -> None:
        for task in list(self._tasks):
            task.cancel()
        if self._socket is not None:
            self._socket.close()

    def _spawn(self, coro) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _serve(self) -> None:
        socket = self._socket
        while True:
            # pyzmq hands queued messages back without a turn of the loop: yield one, or a
            # flood would hold the actor's Ray calls until it drained
            await asyncio.sleep(0)
            frames = await socket.recv_multipart()
            if len(frames) != 5 or not hmac.compare_digest(frames[2], self._token):
                continue  # not one of ours: no reply, nothing unpickled
            peer, call_id, _, method, body = frames
            if method == PING_METHOD:
                await socket.send_multipart([peer, call_id, REPLY_OK, pickle.dumps(None)])
                continue
            self.num_calls += 1
            try:
                name = method.decode()
                if name not in self._methods:
                    raise AttributeError(f"no fast call {name!r}")
                result = getattr(self._target, name)(*pickle.loads(body))
            except Exception as err:
                await self._reply_error(peer, call_id, err)
                continue
            if inspect.isawaitable(result):
                self._spawn(self._finish(peer, call_id, result))
            else:
                await self._reply(peer, call_id, result)

    async def _finish(self, peer: bytes, call_id: bytes, result) -> None:
        try:
            value = await result
        except Exception as err:
            await self._reply_error(peer, call_id, err)
            return
        await self._reply(peer, call_id, value)

    async def _reply(self, peer: bytes, call_id: bytes, value: Any) -> None:
        try:
            body = pickle.dumps(value, protocol=5)
        except Exception as err:
            await self._reply_error(peer, call_id, err)
            return
        await self._socket.send_multipart([peer, call_id, REPLY_OK, body], copy=False)

    async def _reply_error(self, peer: bytes, call_id: bytes, err: Exception) -> None:
        try:
            body = pickle.dumps(err)
        except Exception:  # an error that does not pickle still fails the call
            body = pickle.dumps(RuntimeError(repr(err)))
        await self._socket.send_multipart([peer, call_id, REPLY_ERR, body])
