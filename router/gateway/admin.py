"""The admin API of the external gateway: `/v1/workers`, with the admin key only
(router/front/admin_key.py): the bodies it reads and answers.
"""

from __future__ import annotations

import json
from typing import Any

from router.cluster.external_worker_spec import (
    WorkerChange,
    WorkerSpec,
    WorkerSpecError,
    WorkerStatus,
)
from worker.openai.errors import APIError


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
