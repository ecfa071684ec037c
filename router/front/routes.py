"""The routes the router's OpenAI fronts share beyond the front door's table: /ready and
/metrics answered from the cluster (the index actor, the metrics hub), and the pinned
prefixes API (`/v1/prefixes`).

The ingress gateway and the engine replicas' own HTTP apps (ingress direct) both serve
these; the gateway to external workers answers /ready from its worker set instead.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST
from pydantic import BaseModel
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from router.cluster.metrics_hub import flush_local_pushers
from worker.openai.front import FrontDoor, ready_body
from worker.openai.routes import Handler, Route


class Pins(Protocol):
    """The pinned-prefix service (router/front/prefixes.py's PrefixService)."""

    async def register(self, raw_body: bytes, tenant: str,
                       check_model: Callable[[str | None], None]) -> dict[str, Any]: ...

    async def list(self, tenant: str) -> dict[str, Any]: ...

    async def delete(self, name: str, tenant: str) -> dict[str, Any]: ...


class PinAuth(Protocol):
    """Who may pin (router/front/pin_admin.py's PinAdmin)."""

    def tenant_for_change(self, headers: Mapping[str, str]) -> str: ...


def cluster_ready(index: Any) -> Handler:
    """/ready: 200 once an engine replica publishes to the index actor `index`."""
    async def ready(request: Request) -> Response:
        replica_ids = await index.replica_ids.remote()
        body, status = ready_body(bool(replica_ids), replicas=replica_ids)
        return JSONResponse(body, status_code=status)

    return ready


def cluster_metrics(hub: Any) -> Handler:
    """/metrics: every process's series from the metrics hub `hub`, or with `?node=IP`
    those of the processes on that Ray node (a per-pod scrape target)."""
    async def metrics(request: Request) -> Response:
        await flush_local_pushers()  # this process's series are current
        node = request.query_params.get("node")
        return Response(await hub.exposition.remote(node), media_type=CONTENT_TYPE_LATEST)

    return metrics


def pin_routes(door: FrontDoor, pins: Pins, pin_auth: PinAuth,
               register_body: type[BaseModel]) -> tuple[Route, ...]:
    """POST, GET and DELETE /v1/prefixes: changes need the admin key (pin_auth), a tenant
    lists its own."""
    async def register(request: Request) -> Response:
        tenant = pin_auth.tenant_for_change(request.headers)
        return JSONResponse(await pins.register(await door.body(request), tenant,
                                                door.check_model))

    async def list_pins(request: Request) -> Response:
        return JSONResponse(await pins.list(door.tenant(request)))

    async def delete(request: Request) -> Response:
        tenant = pin_auth.tenant_for_change(request.headers)
        return JSONResponse(await pins.delete(request.path_params["name"], tenant))

    return (Route("POST", "/v1/prefixes", register, register_body),
            Route("GET", "/v1/prefixes", list_pins),
            Route("DELETE", "/v1/prefixes/{name}", delete))
