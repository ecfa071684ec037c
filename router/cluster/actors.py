"""Named, detached cluster actors (the KV index and the metrics hub), found or created."""

from __future__ import annotations

from typing import Any

import ray

KVROUTE_NAMESPACE = "kvroute"


def get_or_create_actor(actor_cls: Any, name: str, *args: Any) -> ray.actor.ActorHandle:
    """The actor named `name` in the kvroute namespace; the first caller creates it.

    Detached, so it outlives the replica that happened to create it, and scheduled outside
    that replica's placement group (Serve replicas capture child actors into theirs, for the
    TP ranks: an index actor placed there would die, and never restart, with the replica).
    Restarted by Ray if its process dies (its state is rebuilt from snapshots and pushes).
    Blocking: call it from a thread when on an event loop.
    """
    return actor_cls.options(
        name=name,
        namespace=KVROUTE_NAMESPACE,
        lifetime="detached",
        get_if_exists=True,
        scheduling_strategy="DEFAULT",
    ).remote(*args)
