"""The route header of a direct request: which router routed it, signed.

HAProxy sets `ROUTE_HEADER` on a request from the ingress router's answer and strips a
client's own value, but an engine replica's HTTP port can also be reached without HAProxy.
So the value carries an HMAC-SHA256 of the router id and route id, under a key made when the
app is built (`new_route_key`) and handed to the ingress routers and the engine replicas in
their deployment configs (never through an environment variable). A replica serves a request
whose MAC does not verify as one no router routed: it reports no route for it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from typing import NamedTuple

ROUTE_HEADER = "x-serve-router-kvroute-route"  # "<router id> <route id> <mac>"
ROUTE_KEY_BYTES = 32
_MAC_HEX_CHARS = 32  # the first 128 bits of the HMAC-SHA256


def new_route_key() -> bytes:
    return secrets.token_bytes(ROUTE_KEY_BYTES)


class Route(NamedTuple):
    router_id: str
    route_id: str


class RouteSigner:
    """Writes and verifies `ROUTE_HEADER` values under one app's key."""

    def __init__(self, key: bytes):
        if len(key) < 16:
            raise ValueError(f"a route key needs >= 16 bytes, got {len(key)}")
        self._key = key

    def header(self, route: Route) -> str:
        return f"{route.router_id} {route.route_id} {self._mac(route)}"

    def verify(self, value: str) -> Route | None:
        """The route a header value names, or None when its MAC does not verify."""
        parts = value.rsplit(" ", 2)
        if len(parts) != 3 or not parts[0] or not parts[1]:
            return None
        route = Route(parts[0], parts[1])
        if not hmac.compare_digest(parts[2].encode(), self._mac(route).encode()):
            return None
        return route

    def _mac(self, route: Route) -> str:
        message = f"{route.router_id} {route.route_id}".encode()
        return hmac.new(self._key, message, hashlib.sha256).hexdigest()[:_MAC_HEX_CHARS]
