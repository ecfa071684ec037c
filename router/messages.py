"""Typed messages between the gateway, the request router and the engine replicas that are
not part of the engine's own API (worker/api.py): pinned-prefix calls and their results.

The request router reads `block_hashes`, `prompt_token_ids` and `target_replica_id` from the
first argument of a call, so every routed message carries them (EngineRequest has the first
two; a request to a specific replica sets the third).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PinRequest:
    """Compute a named prefix on the replica the router picks and pin its blocks."""

    name: str
    prompt_token_ids: list[int]
    block_hashes: list[bytes]
    cache_salt: str = ""
    target_replica_id: str | None = None


@dataclass(frozen=True)
class PinResult:
    replica_id: str
    num_pinned_blocks: int


@dataclass(frozen=True)
class UnpinRequest:
    """Unpin a named prefix on the replica that holds it (routed there by id)."""

    name: str
    target_replica_id: str
    prompt_token_ids: tuple[int, ...] = ()
    block_hashes: tuple[bytes, ...] = ()


@dataclass(frozen=True)
class ReplicaQuery:
    """An operator's question to one replica (routed there by id)."""

    target_replica_id: str
