"""Concurrent requests per tenant, streamed or not: one tenant cannot hold every seat of a
gateway.

Every generation request holds a slot of its tenant until it ends: a stream until its last
event (or its client leaves), a non-streamed request until its whole body is answered. The
names keep "stream" (the `max_streams_per_tenant` setting, worker/process_settings.py; the
chart's `maxStreamsPerTenant`; the 429's code) from when only streams were counted; a
tenant's `stream: false` requests took every seat then. Counted per process that answers
the OpenAI API (a gateway, the external-workers gateway, or an engine replica with ingress
direct: N of them allow N times the limit in all); a request over the limit is refused with
429 and Retry-After before any engine work is done for it. Without API keys there are no
tenants to keep apart: no limit unless the operator sets one.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from worker.openai.errors import APIError

RETRY_AFTER_S = 1
DEFAULT_MAX_STREAMS_PER_TENANT = 64


class TooManyStreams(APIError):
    def __init__(self, limit: int):
        super().__init__(429, f"this API key already has {limit} requests in flight "
                              "(streamed or not); retry when one ends", type_="rate_limit_error",
                         code="too_many_concurrent_streams")
        self.headers = {"Retry-After": str(RETRY_AFTER_S)}


class StreamSlots:
    def __init__(self, max_per_tenant: int):
        if max_per_tenant < 1:
            raise ValueError(f"max_streams_per_tenant must be >= 1, got {max_per_tenant}")
        self.max_per_tenant = max_per_tenant
        self._open: dict[str, int] = {}

    @classmethod
    def for_tenants(cls, keys_configured: bool, max_per_tenant: int | None
                    ) -> StreamSlots | None:
        """With API keys, each tenant's limit (`max_per_tenant`, 64 unless set). Without,
        there is one anonymous user and no per-tenant limit unless the operator set one
        (then it bounds all streams together): a default of 64 would cap a single-user
        server's streams (`kvroute engine`, which has no tenants, and a router in front of
        it may hold many)."""
        if max_per_tenant is None:
            return cls(DEFAULT_MAX_STREAMS_PER_TENANT) if keys_configured else None
        return cls(max_per_tenant)

    def acquire(self, tenant: str) -> None:
        n = self._open.get(tenant, 0)
        if n >= self.max_per_tenant:
            raise TooManyStreams(self.max_per_tenant)
        self._open[tenant] = n + 1

    def release(self, tenant: str) -> None:
        n = self._open[tenant] - 1
        if n:
            self._open[tenant] = n
        else:
            del self._open[tenant]

    def num_open(self, tenant: str) -> int:
        return self._open.get(tenant, 0)

    async def hold(self, tenant: str, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        """`body`, releasing the tenant's slot (taken by `acquire`) when it ends, fails or
        the client leaves."""
        try:
            async for chunk in body:
                yield chunk
        finally:
            self.release(tenant)


class StreamSlot:
    """One request's slot of `tenant`, taken when made (429 over the limit; nothing to take
    when `slots` is None: no limit). `release()` gives it back (a non-streamed request when
    it is answered, a stream that never starts; a second call does nothing); `hold(body)`
    is the stream body that gives it back when the stream ends."""

    __slots__ = ("_slots", "_tenant")

    def __init__(self, slots: StreamSlots | None, tenant: str):
        if slots is not None:
            slots.acquire(tenant)
        self._slots, self._tenant = slots, tenant

    def release(self) -> None:
        if self._slots is not None:
            self._slots.release(self._tenant)
            self._slots = None

    def hold(self, body: AsyncIterator[bytes]) -> AsyncIterator[bytes]:
        slots, self._slots = self._slots, None  # the body gives it back now
        return body if slots is None else slots.hold(self._tenant, body)
