"""The admin API of the external-worker gateway: `/v1/workers`, with the admin key only.

The key comes from the `admin_key` process setting (worker/process_settings.py: a variable
in each process's environment), else from the file the `admin_key_file` setting names (its
first line), read by each gateway process at start (so in Kubernetes, a Secret as an
environment variable or a mounted file). Without a key the admin API is off (403).
A request without a key is 401; with a wrong one, 403. Tenant API keys are not admin keys.
"""

from __future__ import annotations

import hmac
import json
from pathlib import Path
from typing import Any

from router.cluster.worker_spec import (
    WorkerChange,
    WorkerSpec,
    WorkerSpecError,
    WorkerStatus,
)
from worker.openai.errors import APIError
from worker.process_settings import ProcessSettings
from worker.settings import env_name

ADMIN_KEY_VAR = env_name("admin_key")


def load_admin_key(path: str | None, settings: ProcessSettings) -> str | None:
    """The admin key, or None (admin API off). Raises ValueError for an empty key file, or
    for no key where one is required (`require_admin_key`: the builder, or the chart, sets
    it when the app was built with a key, as without one pins would be open)."""
    key = settings.admin_key.get_secret_value().strip() if settings.admin_key else ""
    if key:
        return key
    if path:
        lines = Path(path).read_text().strip().splitlines()
        if not lines or not lines[0].strip():
            raise ValueError(f"admin key file {path} is empty")
        return lines[0].strip()
    if settings.require_admin_key:
        raise ValueError(f"an admin key is required ({env_name('require_admin_key')}=1: the "
                         f"app was built with one) but this process found none "
                         f"(${ADMIN_KEY_VAR} unset or empty, no admin_key_file; on a joined "
                         f"cluster, set it on the nodes): refusing to start")
    return None


class AdminAuth:
    def __init__(self, key: str | None):
        self._key = key

    def check(self, authorization: str | None) -> None:
        """Returns when `Authorization: Bearer KEY` carries the admin key."""
        if self._key is None:
            raise APIError(403, f"the admin API is off: set {ADMIN_KEY_VAR} or admin_key_file",
                           type_="permission_error", code="admin_api_disabled")
        if not authorization:
            raise APIError(401, "missing admin key: send 'Authorization: Bearer KEY'",
                           type_="authentication_error", code="invalid_api_key")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(),
                                                                 self._key.encode()):
            raise APIError(403, "this key may not change the worker set",
                           type_="permission_error", code="not_admin")


def worker_body(status: WorkerStatus) -> dict[str, Any]:
    spec = status.spec
    body: dict[str, Any] = {"object": "worker", "url": spec.url,
                            "kv_events": spec.kv_events_endpoint,
                            "kv_replay": spec.kv_replay_endpoint, "state": status.state,
                            "error": status.error}
    if status.stats is not None:
        body["num_requests_running"] = status.stats.num_running
        body["num_requests_waiting"] = status.stats.num_waiting
    return body


def spec_from_body(raw: bytes) -> WorkerSpec:
    """`{"url": ..., "kv_events": ..., "kv_replay": ...}` (the last two optional)."""
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise APIError(400, f"the request body is not valid JSON: {err}",
                       code="invalid_json") from None
    if not isinstance(data, dict) or not isinstance(data.get("url"), str):
        raise APIError(400, 'expected {"url": "http://host:port", "kv_events": '
                            '"tcp://host:port" (optional), "kv_replay": ... (optional)}',
                       param="url", code="invalid_value")
    unknown = sorted(set(data) - {"url", "kv_events", "kv_replay"})
    if unknown:
        raise APIError(400, f"unknown field(s) {unknown}", param=unknown[0],
                       code="invalid_value")
    for key in ("kv_events", "kv_replay"):
        if data.get(key) is not None and not isinstance(data[key], str):
            raise APIError(400, f"{key} must be a ZMQ endpoint string", param=key,
                           code="invalid_value")
    try:
        spec = WorkerSpec.parse(data["url"])
        if "#" in data["url"]:
            raise WorkerSpecError("give kv_events and kv_replay as fields, not after '#'")
        return WorkerSpec(spec.url, data.get("kv_events"), data.get("kv_replay"))
    except WorkerSpecError as err:
        raise APIError(400, str(err), param="url", code="invalid_value") from None


_CHANGE_STATUS = {"exists": 409, "unknown": 404, "unusable": 502}


def change_body(change: WorkerChange) -> dict[str, Any]:
    """The HTTP answer to an add or a remove; APIError when nothing changed."""
    if change.outcome in _CHANGE_STATUS:
        raise APIError(_CHANGE_STATUS[change.outcome], change.error or change.outcome,
                       code=f"worker_{change.outcome}")
    assert change.status is not None
    return {**worker_body(change.status), "outcome": change.outcome}
