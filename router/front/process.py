"""Which process of the router's fronts this is (a metric label, an index mirror's id)."""

from __future__ import annotations

import os


def process_id() -> str:
    """The Serve replica tag of this process, else `pid-N` (a driver, a test)."""
    from ray import serve  # Ray only where a Serve replica can be asked

    try:
        return serve.get_replica_context().replica_tag
    except Exception:  # not inside a Serve replica
        return f"pid-{os.getpid()}"
