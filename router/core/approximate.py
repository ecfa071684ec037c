"""Which replicas are routed on routed history rather than on their KV events.

All of them while the router is configured approximate or in fallback (the index actor is
unreachable or stale: `set_fallback`); otherwise those that publish no events or whose
events went stale, one by one (`set_replica`), while the others are routed on events. The
history (router.core.history) is active while any replica is; once activated it warms up a
slice per decision, and until it is warm the last event data decides (the decision is
still flagged approximate).
"""

from __future__ import annotations

from collections.abc import Sequence

from router.core.history import RoutedHistory


class ApproximateMode:
    def __init__(self, configured: bool, history: RoutedHistory, warmup_blocks: int) -> None:
        self.configured = configured
        self.history = history
        self.warmup_blocks = warmup_blocks  # history replayed per decision while warming
        self.fallback = False
        self._replica_ids: set[str] = set()

    @property
    def all_replicas(self) -> bool:
        """True while every decision uses routed history (configured, or fallback)."""
        return self.configured or self.fallback

    def is_approximate(self, replica_id: str) -> bool:
        return self.configured or self.fallback or replica_id in self._replica_ids

    def set_fallback(self, active: bool) -> None:
        self.fallback = active
        self._sync_history()

    def set_replica(self, replica_id: str, approximate: bool) -> None:
        if approximate:
            self._replica_ids.add(replica_id)
        else:
            self._replica_ids.discard(replica_id)
        self._sync_history()

    def remove_replica(self, replica_id: str) -> None:
        if replica_id in self._replica_ids:
            self._replica_ids.discard(replica_id)
            self._sync_history()

    def on_history(self, replica_ids: Sequence[str]) -> frozenset[str]:
        """The candidates to match on routed history for this decision: none while the
        history is still warming up (the last event data, stale but better than a half-built
        history, decides, pending marks included); each call warms it a step."""
        on_history = self.candidates(replica_ids)
        if on_history and self.history.warming:
            self.history.warm_step(self.warmup_blocks)
            if self.history.warming:
                on_history = frozenset()
        return on_history

    def candidates(self, replica_ids: Sequence[str]) -> frozenset[str]:
        """The candidates routed on history rather than on events."""
        if self.configured or self.fallback:
            return frozenset(replica_ids)
        if not self._replica_ids:
            return frozenset()
        return self._replica_ids.intersection(replica_ids)

    def _sync_history(self) -> None:
        self.history.set_active(self.configured or self.fallback or bool(self._replica_ids))
