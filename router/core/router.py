"""The router core's facade: one object the gateway asks where each request goes.

Pure Python (kv, protocol.engine, no Ray, no torch). The serving side feeds it events, snapshots
and stats, tells it when requests finish, and switches it to approximate mode: all replicas
when the index actor is unreachable or stale (`set_fallback`), or one replica at a time when
that replica publishes no events or its events went stale (`set_replica_approximate`), while
the others are still routed on their events.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import NamedTuple

from kv.events import EventBatch, Snapshot
from kv.hashing import BlockHash
from protocol.engine import EngineStats
from router.core.approximate import ApproximateMode
from router.core.config import RouterConfig
from router.core.history import RoutedHistory
from router.core.index import PrefixIndex, PrefixMatch
from router.core.ledger import (
    Expired,
    Ledger,
    LedgerConfig,
    Release,
    RouteKind,
    RouteRecord,
    RouteState,
)
from router.core.load import LoadTracker, bounded_tokens
from router.core.miss_causes import MissCauses, MissTokens
from router.core.pins import PinnedRuns
from router.core.policies import ReplicaView, RouteQuery, make_policy

__all__ = ["RouteKind", "Router", "RouterConfig", "RoutingDecision"]


class RoutingDecision(NamedTuple):
    replica_id: str
    predicted_device_hit_tokens: int
    predicted_host_hit_tokens: int
    approximate: bool  # decided without event data (routed history only)
    # Every candidate, best first (replica_id is the first): where the request should go
    # when the ones before it are full. () only in a decision built by hand.
    ranked_ids: tuple[str, ...] = ()


class Router:
    """Routes requests to replicas; keeps the prefix index mirror, routed history and load.

    Args:
        config: the router's settings.
        clock: seconds, monotonic; drives pending-mark and history expiry and dates the
            ledger's records (inject a fake one in tests and in the simulator).
        ledger: when the ledger releases a request whose end never came (`expire`).
    """

    def __init__(self, config: RouterConfig, clock: Callable[[], float] = time.monotonic,
                 ledger: LedgerConfig | None = None):
        self.config = config
        self.clock = clock
        self.policy = make_policy(config.policy, config)
        self.index = PrefixIndex(config.pending_ttl_s, clock)
        self.history = RoutedHistory(config.approx_capacity_blocks, config.approx_ttl_s, clock,
                                     active=config.approximate)
        self.loads = LoadTracker(config.decode_weight, config.recent_work_half_life_s, clock)
        self.mode = ApproximateMode(config.approximate, self.history,
                                    config.fallback_warmup_blocks)
        # request id -> where it went, how far it got and the blocks it holds pending
        # there, until it is ended or withdrawn (router.core.ledger)
        self.ledger = Ledger(ledger)
        self.pins = PinnedRuns()  # confirmed runs of outstanding requests (`mark_whole_prompt`)
        self.misses = MissCauses(config.block_size, config.seen_window_blocks)

    @property
    def approximate(self) -> bool:
        """True while decisions use routed history only (configured, or fallback)."""
        return self.mode.all_replicas

    def route(self, request_id: str, block_hashes: Sequence[BlockHash], num_prompt_tokens: int,
              replica_ids: Sequence[str], max_tokens: int = 0,
              kind: RouteKind = RouteKind.PROXIED, num_sequences: int = 1) -> RoutingDecision:
        """Ranks `replica_ids` and records the decision on the first, in the ledger: the
        prompt's blocks become pending on it, its outstanding work grows until it is ended
        (`on_finished`) or withdrawn. If the request then lands on another candidate (the
        first was full), call `move` (`dispatched` for a Serve call). `kind` says how its
        end comes back (router.core.ledger.RouteKind).

        Routing an id that is still outstanding (a retry) first drops its earlier record,
        so its own pending marks and load do not count on its earlier replica.

        `max_tokens` counts up to `MAX_WORK_TOKENS` (router.core.load): the entry points
        bound it, and whatever reaches here cannot make a load infinite. It is the output of
        all `num_sequences` completions (n x the prompts of a batch); each is charged.

        Raises ValueError when there is no candidate or the hashes cannot be the prompt's.
        """
        if not replica_ids:
            raise ValueError(f"route {request_id}: no replica to choose from")
        start_s = time.perf_counter()
        block_size = self.config.block_size
        if len(block_hashes) * block_size > num_prompt_tokens:
            raise ValueError(f"route {request_id}: {len(block_hashes)} block hashes for "
                             f"{num_prompt_tokens} prompt tokens at block size {block_size}")
        if len(set(replica_ids)) != len(replica_ids):
            replica_ids = list(dict.fromkeys(replica_ids))
        max_tokens = int(bounded_tokens(max_tokens))  # the policy's and the load's input
        if request_id in self.ledger:
            self._withdraw(request_id)  # a retry: its old marks and load are not a hit
        on_history = self._on_history(replica_ids)
        policy = self.policy
        confirmed: dict[str, int] = {}  # device runs that pending marks carried on
        matches = (self._match(block_hashes, replica_ids, on_history, confirmed)
                   if policy.uses_index else {})
        query = RouteQuery(request_id, block_hashes, num_prompt_tokens, max_tokens, replica_ids)
        view = ReplicaView(matches, self.loads.load, self.loads.loads)
        ranked_ids = tuple(policy.rank(query, view))
        if len(ranked_ids) != len(replica_ids) or ranked_ids[0] not in replica_ids:
            raise RuntimeError(f"policy {policy.name} ranked {ranked_ids!r}, not the "
                               f"candidates {list(replica_ids)!r}")
        replica_id = ranked_ids[0]
        if not policy.uses_index:  # every candidate's match too: the miss causes need them
            matches = self._match(block_hashes, replica_ids, on_history, confirmed)
        routed = RouteRecord(replica_id, kind, RouteState.ROUTED, self.clock(), block_hashes, (),
                             num_prompt_tokens, max_tokens, num_sequences=num_sequences)
        device_tokens, host_tokens = self._record(routed, request_id, matches.get(replica_id),
                                                  confirmed, on_history, start_s)
        self.misses.on_route(request_id, block_hashes, num_prompt_tokens, matches)
        return RoutingDecision(replica_id, device_tokens, host_tokens,
                               self.is_approximate(replica_id), ranked_ids)

    def move(self, request_id: str, replica_id: str) -> RoutingDecision | None:
        """The request was sent to `replica_id`, not where `route` recorded it (that one
        was full): its marks and load move there. None (nothing recorded) when the request
        is not outstanding; the decision on the new replica otherwise."""
        entry = self.ledger.get(request_id)
        if entry is None:
            return None
        if entry.replica_id != replica_id:
            view = self.misses.take(request_id)  # every candidate's match: still the view
            self._withdraw(request_id)
            if view is not None:
                self.misses.keep(request_id, view)
            on_history = self._on_history((replica_id,))
            confirmed: dict[str, int] = {}
            matches = self._match(entry.block_hashes, (replica_id,), on_history, confirmed)
            self._record(entry._replace(replica_id=replica_id, state=RouteState.MOVED),
                         request_id, matches.get(replica_id), confirmed, on_history)
            self.policy.moved(entry.block_hashes, replica_id)
        return RoutingDecision(replica_id, *self.ledger.get(request_id).predicted_hit_tokens,
                               self.is_approximate(replica_id), (replica_id,))

    def dispatched(self, request_id: str, replica_id: str) -> RouteRecord | None:
        """Serve handed the call to `replica_id` (moved there if it was recorded on
        another): from now on only its completion ends it. Its record then; None when it is
        not an undispatched Serve call (released already, or a direct route)."""
        entry = self.ledger.get(request_id)
        if entry is None or entry.kind is not RouteKind.CALL or (
                entry.state is RouteState.DISPATCHED):
            return None
        if entry.replica_id != replica_id:
            self.move(request_id, replica_id)
        return self.ledger.dispatch(request_id)

    def abandon(self, request_id: str) -> str | None:
        """A Serve call its caller gave up on while Serve was routing it: withdrawn (it
        never ran) unless it was dispatched already (its completion ends it then). Its
        replica when withdrawn; None otherwise."""
        entry = self.ledger.get(request_id)
        if entry is None or entry.kind is not RouteKind.CALL or (
                entry.state is RouteState.DISPATCHED):
            return None
        self._withdraw(request_id)
        return entry.replica_id

    def claim(self, request_id: str) -> bool:
        """A direct route's replica reported it arrived: no longer withdrawn for want of a
        claim (`expire`). False when it is not an unclaimed direct route."""
        return self.ledger.claim(request_id)

    def expire(self, idle_replica_ids: frozenset[str] | None = None) -> list[Expired]:
        """Releases the requests whose end will not come, by the ledger's policy
        (router.core.ledger.Ledger.expire), each ended or withdrawn; returns them.
        `idle_replica_ids` only from a fresh report of the replicas (None otherwise)."""
        expired = self.ledger.expire(self.clock(), idle_replica_ids)
        for request_id, _, release in expired:
            if release is Release.END:
                self.on_finished(request_id)
            else:
                self._withdraw(request_id)
        return expired

    def _on_history(self, replica_ids: Sequence[str]) -> frozenset[str]:
        return self.mode.on_history(replica_ids)

    def _record(self, routed: RouteRecord, request_id: str, match: PrefixMatch | None,
                confirmed: dict[str, int], on_history: frozenset[str],
                started_s: float | None = None) -> tuple[int, int]:
        """Marks and load of a request sent to `routed.replica_id`, and its record in the
        ledger (`started_s`: when the decision began, perf counter seconds; a move keeps
        the decision's time); returns the device and host tokens it is predicted to find
        cached there."""
        replica_id, block_hashes = routed.replica_id, routed.block_hashes
        device_tokens, host_tokens = (
            match.hit_tokens(self.config.block_size, routed.num_prompt_tokens)
            if match else (0, 0))
        held: Sequence[BlockHash] = ()
        if replica_id not in on_history:
            # Mark from the end of the confirmed device run: the blocks this request computes
            # or copies in, and pending ones it refreshes. The walk measured that run. With
            # `mark_whole_prompt` the run is pinned too: marked if evicted before the request
            # finishes (router.core.pins), not marked now, so a decision costs no more.
            num_confirmed = confirmed.get(replica_id, match.num_device_blocks if match else 0)
            # a tuple of hashes: the collector untracks it at its first pass (a list slice
            # would be walked by every collection while the request is outstanding)
            held = tuple(block_hashes[num_confirmed:])
            self.index.mark_pending(replica_id, held, held=True)
            if num_confirmed and self.config.mark_whole_prompt:
                self.pins.pin(replica_id, request_id, num_confirmed)
        decision_s = routed.decision_s if started_s is None else time.perf_counter() - started_s
        self.ledger.put(request_id, RouteRecord(  # positional: a decision pays no _replace
            replica_id, routed.kind, routed.state, routed.routed_at_s, block_hashes, held,
            routed.num_prompt_tokens, routed.max_tokens, (device_tokens, host_tokens),
            decision_s, routed.num_sequences))
        self.history.record(replica_id, block_hashes)
        self._add_load(request_id, routed, device_tokens, host_tokens)
        return device_tokens, host_tokens

    def _add_load(self, request_id: str, routed: RouteRecord, device_tokens: int,
                  host_tokens: int) -> None:
        """The request's work joins its replica's load until it finishes (and its recent
        work, decaying). The simulator's what-if routers replace this
        (benchmarks/simlib/whatifs.py)."""
        prefill_tokens, decode_tokens = self._work(routed, device_tokens, host_tokens)
        self.loads.add(request_id, routed.replica_id,
                       prefill_tokens + self.config.decode_weight * decode_tokens, decode_tokens,
                       num_sequences=routed.num_sequences)

    def _work(self, routed: RouteRecord, device_tokens: int, host_tokens: int
              ) -> tuple[float, float]:
        """The request's prefill work, in prefill tokens (its uncached prompt tokens, host
        hits at `host_cost_fraction`, every cached token at `cached_load_fraction`), and the
        decode tokens it is expected to produce (router.core.load: not its max_tokens), which
        weigh `decode_weight` prefill tokens each."""
        config = self.config
        prefill_tokens = (routed.num_prompt_tokens - device_tokens - host_tokens
                          + config.host_cost_fraction * host_tokens
                          + config.cached_load_fraction * (device_tokens + host_tokens))
        return prefill_tokens, self.loads.decode_tokens(routed.max_tokens, routed.num_sequences)

    def _match(self, block_hashes: Sequence[BlockHash], replica_ids: Sequence[str],
               on_history: frozenset[str], confirmed: dict[str, int]
               ) -> Mapping[str, PrefixMatch]:
        """Each candidate's cached prefix: from the index for replicas routed on events,
        from the history for the others."""
        if not on_history:
            return self.index.match(block_hashes, replica_ids, confirmed)
        on_events = [r for r in replica_ids if r not in on_history]
        if not on_events:
            return self.history.match(block_hashes, replica_ids)
        matches = dict(self.index.match(block_hashes, on_events, confirmed))
        matches.update(self.history.match(
            block_hashes, [r for r in replica_ids if r in on_history]))
        return matches

    def on_finished(self, request_id: str, delivered_tokens: int | None = None,
                    output_tokens: int | None = None, *, count_misses: bool = False
                    ) -> MissTokens | None:
        """Drops the request's outstanding work, and starts the TTL of its pending marks
        (unknown ids are ignored). With `delivered_tokens`, the prompt tokens its engine
        served from cache, returns why the others missed (router.core.miss_causes). Without
        them, `count_misses` (the request ran; its engine did not say what hit) returns the
        causes the decision knew: cold, capacity and placement of the tokens it predicted
        uncached, with no race (the prediction taken as delivered). With `output_tokens`,
        what it produced: its replica's recent work counts that in place of the decode it
        was charged, and the decode charged from now on learns it."""
        causes = None
        entry = self.ledger.get(request_id)
        if entry is not None and (delivered_tokens is not None or count_misses):
            causes = self.misses.on_end(request_id, entry.replica_id,
                                        sum(entry.predicted_hit_tokens), delivered_tokens)
        self.loads.finish(request_id, output_tokens)
        self._release_held(request_id)
        return causes

    def withdraw(self, request_id: str) -> None:
        """The request never ran where it was routed (it did not get there, or that replica
        refused it): its load goes at once, its recent work too, and the pending marks only
        it held (unknown ids are ignored)."""
        if request_id in self.ledger:
            self._withdraw(request_id)

    def _release_held(self, request_id: str, withdraw: bool = False) -> None:
        self.misses.forget(request_id)
        entry = self.ledger.pop(request_id)
        if entry is None:
            return
        self.pins.unpin(entry.replica_id, request_id)
        if entry.held:
            self.index.release_pending(entry.replica_id, entry.held, withdraw)

    def _withdraw(self, request_id: str) -> None:
        """Drops a decision whose request did not go where it was recorded: its load, and
        the pending marks only it held, at once (no event of it will come)."""
        self.loads.withdraw(request_id)
        self._release_held(request_id, withdraw=True)

    def update_stats(self, replica_id: str, stats: EngineStats) -> None:
        self.loads.update_stats(replica_id, stats)

    def apply_batch(self, batch: EventBatch) -> bool:
        """Applies a replica's event batch; True when that replica needs a snapshot."""
        return self.apply_batches([batch])[0]

    def apply_batches(self, batches: Sequence[EventBatch]) -> list[bool]:
        """Applies the batches (a poll's, of any replicas) in one pass over the index; per
        batch, True when its replica needs a snapshot."""
        needs_snapshot = self.index.apply_batches(batches)
        for batch in batches:
            self.misses.on_events(batch.events)
        for replica_id in {b.replica_id for b in batches} & self.pins.replica_ids():
            self.pins.on_evictions(replica_id, self.index, self.ledger)
        return needs_snapshot

    def apply_snapshot(self, snapshot: Snapshot) -> None:
        self.index.apply_snapshot(snapshot)
        if snapshot.replica_id in self.pins.replica_ids():
            self.pins.on_evictions(snapshot.replica_id, self.index, self.ledger)

    def remove_replica(self, replica_id: str) -> None:
        """Forgets the replica: its index entries, pending marks, history, stats and load."""
        self.index.remove_replica(replica_id)
        self.history.remove_replica(replica_id)
        self.loads.remove_replica(replica_id)
        self.mode.remove_replica(replica_id)
        for request_id in self.ledger.on_replica(replica_id):
            self.ledger.pop(request_id)  # its marks went with the replica, its load too
            self.misses.forget(request_id)
        self.pins.drop_replica(replica_id)

    def drop_index(self, replica_id: str) -> None:
        """Forgets what events said the replica holds, and its pending marks, but keeps its
        routed history and load: its events stopped (route it on history meanwhile, see
        `set_replica_approximate`)."""
        self.index.remove_replica(replica_id)
        for request_id in self.ledger.on_replica(replica_id):
            entry = self.ledger.get(request_id)
            if entry.held:
                self.ledger.put(request_id, entry._replace(held=()))  # its marks are gone
        self.pins.drop_replica(replica_id)  # nothing confirmed there any more

    def set_fallback(self, active: bool) -> None:
        """While active, decide in approximate mode (the index is unreachable or stale).

        Turning it on starts building the history's LRU and index from what this router
        routed, `fallback_warmup_blocks` hashes per decision; until every replica is
        replayed, decisions use the last event data (flagged approximate).
        """
        self.mode.set_fallback(active)

    def set_replica_approximate(self, replica_id: str, approximate: bool) -> None:
        """Routes one replica on routed history (True: it publishes no events, or they went
        stale) or on its events again (False), from the next decision on; the other
        replicas keep their own mode. The first approximate replica starts the history's
        LRU and index as `set_fallback` does; until they are replayed, the last event data
        decides for it (flagged approximate)."""
        self.mode.set_replica(replica_id, approximate)

    def is_approximate(self, replica_id: str) -> bool:
        """True while decisions about the replica use routed history, not events."""
        return self.mode.is_approximate(replica_id)

    def index_blocks(self) -> dict[str, int]:
        """Distinct block hashes in the index that decisions use, by medium."""
        if self.config.approximate:
            return {"device": self.history.num_blocks(), "host": 0}
        return {"device": self.index.num_blocks("device"), "host": self.index.num_blocks("host")}

    def check_invariants(self) -> None:
        self.pins.check_invariants(self.ledger)
        self.ledger.check_invariants()
        self.index.check_invariants()
        self.history.check_invariants()
        self.loads.check_invariants()
