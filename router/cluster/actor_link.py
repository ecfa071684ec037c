"""One process's link to a named cluster actor: a handle found lazily, and a loop calling it.

The metrics pusher (to the metrics hub), the replica publisher (to the KV index) and the
index mirror (long-polling the KV index) each hold one. The rules they share live here:

- the handle is found (or the actor created) by name on first use, from a thread, since
  `ray.get_actor` blocks;
- a failed call loses the handle, so the next call finds the actor again by name: Ray
  restarts a dead actor under the same name, or the finder re-creates it;
- the loop runs one call, sleeps `interval_s` after a success and `retry_interval_s` after
  a failure, and ends when the task is cancelled or Ray is shut down (a driver that shut
  Ray down would otherwise leave it running).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import ray

from router.cluster.fast_calls import FastHandle

log = logging.getLogger(__name__)

T = TypeVar("T")
ActorCall = Callable[[Any], Awaitable[T]]  # one round trip, given the actor's handle


class ActorLink:
    """A lazily found handle to one named actor, and an optional periodic call to it.

    Args:
        description: names the link in logs ("metrics push from engine/r0").
        find_actor: returns the actor's handle, finding or creating it by name; blocking.
        handle: a handle already at hand (used until a call fails).
        on_failure: told of every failed call of `try_call` and the loop, after the log.
    """

    def __init__(self, description: str, find_actor: Callable[[], Any], handle: Any = None,
                 on_failure: Callable[[Exception], None] | None = None):
        self.description = description
        self._find_actor = find_actor
        self._handle = handle
        self._on_failure = on_failure
        self._task: asyncio.Task | None = None
        self._finding: asyncio.Lock | None = None  # one find at a time (made on first use)

    @property
    def found_handle(self) -> Any:
        """The handle if one is at hand, else None: for a goodbye that must not create the
        actor only to say it."""
        return self._handle

    async def handle(self) -> Any:
        if self._handle is None:
            if self._finding is None:
                self._finding = asyncio.Lock()
            async with self._finding:  # calls that found none wait for one find
                if self._handle is None:
                    self._handle = await asyncio.to_thread(self._find_actor)
        return self._handle

    async def call(self, call: ActorCall[T]) -> T:
        """Runs `call` with the handle; a failure loses the handle and is raised."""
        handle = await self.handle()
        try:
            return await call(handle)
        except Exception:
            self._lose(handle)
            raise

    def _lose(self, handle: Any) -> None:
        """The handle a call failed on is found again next time (unless it was already);
        a fast one closes its socket once its other calls are done."""
        if self._handle is handle:
            self._handle = None
        if isinstance(handle, FastHandle):
            handle.close_when_idle()

    async def try_call(self, call: ActorCall[Any]) -> bool:
        """Runs `call`; True on success. A failure is logged and told to `on_failure`."""
        try:
            await self.call(call)
            return True
        except Exception as err:  # RayError, a timeout, or Ray itself going down
            log.warning("%s failed: %r", self.description, err)
            if self._on_failure is not None:
                self._on_failure(err)
            return False

    def start(self, call: ActorCall[Any], interval_s: float, retry_interval_s: float) -> None:
        """Runs `call` in a loop on the running event loop (once: later starts are no-ops)."""
        if not (interval_s >= 0 and retry_interval_s > 0):
            raise ValueError(f"{self.description}: interval_s must be >= 0 and "
                             f"retry_interval_s > 0, got {interval_s}, {retry_interval_s}")
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(call, interval_s, retry_interval_s))

    def stop(self) -> None:
        """Ends the loop; the handle stays, for a goodbye through it."""
        if self._task is not None:
            self._task.cancel()
            self._task = None

    async def _run(self, call: ActorCall[Any], interval_s: float, retry_interval_s: float) -> None:
        while ray.is_initialized():
            ok = await self.try_call(call)
            await asyncio.sleep(interval_s if ok else retry_interval_s)
