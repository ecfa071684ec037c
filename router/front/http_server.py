"""An ASGI app served by uvicorn inside the current process, on a shared port.

The external gateway answers HTTP itself rather than behind Ray Serve's proxy, so a
token crosses one HTTP hop (client -> gateway -> worker, both HTTP) and no Ray call. Each
gateway process binds the same host:port with SO_REUSEPORT: the kernel spreads new
connections over the gateway processes of a node.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from dataclasses import dataclass

import uvicorn

log = logging.getLogger(__name__)

_KEEP_ALIVE_S = 75  # idle client connections (nginx's default)


@dataclass(frozen=True)
class HttpConfig:
    host: str = "0.0.0.0"
    port: int = 8000
    # On shutdown, how long accepted requests (streams) may run before they are cut.
    graceful_shutdown_timeout_s: float = 30.0

    def __post_init__(self):
        if not 1 <= self.port <= 65535:
            raise ValueError(f"HttpConfig: port must be in [1, 65535], got {self.port}")
        if not self.graceful_shutdown_timeout_s > 0:
            raise ValueError("HttpConfig: graceful_shutdown_timeout_s must be > 0")


def _shared_socket(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    try:
        sock.bind((host, port))
    except OSError as err:
        sock.close()
        raise OSError(f"cannot listen on {host}:{port}: {err}") from None
    sock.set_inheritable(True)
    return sock


class HttpServer:
    """Serves `app` on the running event loop until `stop`."""

    def __init__(self, app, config: HttpConfig):
        self.config = config
        self._server = uvicorn.Server(uvicorn.Config(
            app, host=config.host, port=config.port, http="httptools", lifespan="off",
            log_level="warning", access_log=False,
            # Longer than clients keep idle connections (httpx 5 s, aiohttp 15 s), so a
            # client never sends on a connection this side has just closed.
            timeout_keep_alive=_KEEP_ALIVE_S,
            timeout_graceful_shutdown=config.graceful_shutdown_timeout_s))
        self._task: asyncio.Task | None = None

    async def start(self, timeout_s: float = 60.0) -> None:
        """Returns once the port is bound and the server accepts connections."""
        sock = _shared_socket(self.config.host, self.config.port)
        loop = asyncio.get_running_loop()
        self._task = loop.create_task(self._server.serve([sock]))
        deadline = loop.time() + timeout_s
        while not self._server.started:  # uvicorn sets it once listening: poll it
            if self._task.done():  # it could not start: its exception says why
                self._task.result()
                raise RuntimeError(f"the HTTP server on port {self.config.port} stopped")
            if loop.time() > deadline:
                self._task.cancel()
                raise RuntimeError(f"the HTTP server on port {self.config.port} did not "
                                   f"start within {timeout_s} s")
            await asyncio.sleep(0.01)
        log.info("gateway listening on %s:%d", self.config.host, self.config.port)

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done() and self._server.started

    async def stop(self) -> None:
        """Stops accepting, lets accepted requests finish (up to the graceful timeout)."""
        if self._task is None:
            return
        self._server.should_exit = True
        try:
            await asyncio.wait_for(asyncio.shield(self._task),
                                   self.config.graceful_shutdown_timeout_s + 5.0)
        except asyncio.TimeoutError:
            self._task.cancel()
