"""External workers: how one is named and reached, and what the worker set says about it.

A worker is an OpenAI-compatible server (vLLM, SGLang, `kvroute engine`). It is written

    URL[#kv_events=ENDPOINT[&kv_replay=ENDPOINT]]

URL is the server root (`http://host:8000`; a trailing `/v1` is dropped, so an OpenAI base
URL works too). The fragment, which an HTTP client never sends, names the worker's KV
event publisher (ZMQ PUB, vLLM's wire format) and its replay socket, when it has them.
The canonical URL is the worker's id everywhere: in the worker set, in the KV index (the
replica id its events are filed under) and in metric labels.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal
from urllib.parse import parse_qs, urlsplit, urlunsplit

from protocol.engine import EngineStats

ZMQ_SCHEMES = ("tcp", "ipc", "inproc")
_FRAGMENT_KEYS = ("kv_events", "kv_replay")


class WorkerSpecError(ValueError):
    """A worker that cannot be parsed (the message quotes it)."""


@dataclass(frozen=True)
class WorkerSpec:
    url: str  # canonical server root: scheme://host[:port][/path], no trailing slash or /v1
    kv_events_endpoint: str | None = None  # ZMQ PUB of its KV events
    kv_replay_endpoint: str | None = None  # ZMQ ROUTER answering replay requests

    def __post_init__(self):
        if canonical_url(self.url) != self.url:
            raise WorkerSpecError(f"worker URL {self.url!r} is not canonical "
                                  f"({canonical_url(self.url)!r}); build it with WorkerSpec.parse")
        for name in ("kv_events_endpoint", "kv_replay_endpoint"):
            endpoint = getattr(self, name)
            if endpoint is not None and urlsplit(endpoint).scheme not in ZMQ_SCHEMES:
                raise WorkerSpecError(f"worker {self.url}: {name} {endpoint!r} is not a ZMQ "
                                      f"endpoint ({'/'.join(ZMQ_SCHEMES)}://...)")
        if self.kv_replay_endpoint is not None and self.kv_events_endpoint is None:
            raise WorkerSpecError(f"worker {self.url}: kv_replay without kv_events")

    @property
    def worker_id(self) -> str:
        return self.url

    @classmethod
    def parse(cls, text: str) -> WorkerSpec:
        """From `URL[#kv_events=...&kv_replay=...]`; WorkerSpecError names what is wrong."""
        text = text.strip()
        url, _, fragment = text.partition("#")
        fields: dict[str, str] = {}
        for key, values in parse_qs(fragment, keep_blank_values=True).items():
            if key not in _FRAGMENT_KEYS:
                raise WorkerSpecError(f"worker {text!r}: unknown key {key!r} after '#' "
                                      f"(known: {', '.join(_FRAGMENT_KEYS)})")
            if len(values) != 1 or not values[0]:
                raise WorkerSpecError(f"worker {text!r}: {key} needs exactly one endpoint")
            fields[key] = values[0]
        return cls(canonical_url(url), fields.get("kv_events"), fields.get("kv_replay"))

    def __str__(self) -> str:
        parts = [f"{k}={v}" for k, v in (("kv_events", self.kv_events_endpoint),
                                          ("kv_replay", self.kv_replay_endpoint)) if v]
        return self.url + ("#" + "&".join(parts) if parts else "")


def canonical_url(url: str) -> str:
    """`http://Host:8000/v1/` -> `http://host:8000`; WorkerSpecError if it is no HTTP URL."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise WorkerSpecError(f"worker URL {url!r} must be http://host[:port] or https://...")
    if parts.query:
        raise WorkerSpecError(f"worker URL {url!r} must not have a query string")
    try:
        port = parts.port
    except ValueError:
        raise WorkerSpecError(f"worker URL {url!r} has a bad port") from None
    path = parts.path.rstrip("/").removesuffix("/v1").rstrip("/")
    host = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
    netloc = host if port is None else f"{host}:{port}"
    return urlunsplit((parts.scheme, netloc, path, "", ""))


def parse_workers(items: str | Iterable[str]) -> tuple[WorkerSpec, ...]:
    """A comma-separated string or a list of specs; duplicates (same URL) are an error."""
    texts = items.split(",") if isinstance(items, str) else list(items)
    specs = tuple(WorkerSpec.parse(t) for t in texts if t.strip())
    seen: set[str] = set()
    for spec in specs:
        if spec.worker_id in seen:
            raise WorkerSpecError(f"worker {spec.worker_id} is listed twice")
        seen.add(spec.worker_id)
    return specs


WorkerState = Literal["up", "down"]


@dataclass(frozen=True)
class WorkerStatus:
    """One worker as the worker set sees it."""

    spec: WorkerSpec
    state: WorkerState  # up: routable; down: its last health check failed (drained)
    error: str | None = None  # why it is down
    stats: EngineStats | None = None  # from its vLLM queue gauges, when it exports them
    # device KV capacity (tokens), from its vllm:cache_config_info, when it exports it
    kv_capacity_tokens: int | None = None
    # scrapes whose gauges were not queue lengths (NaN, infinite, negative, huge): dropped
    num_rejected_load_samples: int = 0


@dataclass(frozen=True)
class WorkerSetView:
    """The worker set at one version (it grows on every change, stats included)."""

    version: int
    workers: tuple[WorkerStatus, ...]

    def up(self) -> tuple[WorkerStatus, ...]:
        return tuple(w for w in self.workers if w.state == "up")


ChangeOutcome = Literal["added", "removed", "exists", "unknown", "unusable"]


@dataclass(frozen=True)
class WorkerChange:
    """The answer to an add or a remove: what happened, and the worker's status."""

    outcome: ChangeOutcome  # exists/unknown: nothing changed; unusable: failed its checks
    status: WorkerStatus | None = None  # the worker as added or removed
    error: str | None = None  # why nothing changed
