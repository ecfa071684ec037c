"""Why a routed request's uncached prompt tokens were not cached, counted in tokens.

At the decision the router knows each candidate's cached prefix of the prompt (its index, or
its routed history in approximate mode); a window of the blocks earlier requests used or
replicas stored (`SeenWindow`) tells seen from never seen. That splits the prompt into token
ranges, which the engine's delivered count D closes when the request ends:

    0 ......... p ............ o ............ s ............ c ...... n
    | predicted |  placement   |   capacity   |     cold     |  cold  |
      cached on   another        seen, held     not seen       no cache holds these:
      the chosen  replica holds  by none        lately         the partial last block,
      replica     it                                           the last token it computes

    D < p: tokens [D, p) were cached on the chosen replica at the decision and gone when
           the request ran: `race`; the ranges from p on keep their causes.
    D > p: tokens [p, D) hit after all (a block arrived meanwhile): they miss nothing, and
           the ranges count from D on.

So the causes of a request add up to n - D, its uncached prompt tokens, exactly. Only
requests whose delivered count comes back are counted: a refused or lost one ran nothing.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from itertools import repeat
from typing import NamedTuple

from kv.events import BlockStored, KVEvent
from kv.hashing import BlockHash
from router.core.hash_loops import num_leading_in
from router.core.prefix_match import PrefixMatch, PrefixMatches


class MissTokens(NamedTuple):
    """Uncached prompt tokens of requests, by cause."""

    cold: int = 0
    capacity: int = 0
    placement: int = 0
    race: int = 0

    @property
    def total(self) -> int:
        return self.cold + self.capacity + self.placement + self.race

    def __add__(self, other: tuple) -> MissTokens:  # type: ignore[override]
        cold, capacity, placement, race = other
        return MissTokens(self.cold + cold, self.capacity + capacity,
                          self.placement + placement, self.race + race)


CAUSES = MissTokens._fields  # the metric's `cause` label values


def split_causes(num_prompt_tokens: int, cacheable_tokens: int, predicted_tokens: int,
                 elsewhere_tokens: int, seen_tokens: int, delivered_tokens: int) -> MissTokens:
    """The causes of a request's uncached prompt tokens (the ranges of the module's map).

    Args:
        num_prompt_tokens: n.
        cacheable_tokens: what any engine could serve from cache: full blocks, less the
            last token, which it always computes (c).
        predicted_tokens: cached on the chosen replica at the decision (p, before capping
            at c).
        elsewhere_tokens: the longest cached prefix on any other candidate.
        seen_tokens: the leading tokens whose blocks the window had seen.
        delivered_tokens: what the engine served from cache (D).

    Returns causes that add up to n - D (D clamped to [0, n]) for any input.
    """
    n, c = num_prompt_tokens, max(min(cacheable_tokens, num_prompt_tokens), 0)
    d = min(max(delivered_tokens, 0), n)
    p = min(max(predicted_tokens, 0), c)
    o = max(p, min(elsewhere_tokens, c))
    s = max(o, min(seen_tokens, c))
    start = max(p, d)
    # positional: keywords cost a NamedTuple a dict (this runs at every request's end)
    return MissTokens(n - max(s, start), max(s - max(o, start), 0), max(o - start, 0),
                      max(p - d, 0))


_PENDING_BLOCKS = 1 << 16  # stored hashes a window keeps aside before adding them


class SeenWindow:
    """Block hashes used or stored lately, in bounded memory: two generations of at most
    `capacity_blocks / 2` hashes each. New hashes go into the current one; when it
    is full it becomes the previous one and the old previous one is dropped. A block is
    remembered for at least `capacity_blocks / 2` distinct block insertions after its last
    use and at most `capacity_blocks` hashes are held (about 100 bytes each: a dict entry
    and, at worst, the hash's own bytes object). Dicts with None values, not sets: they hold
    no GC-tracked objects (router.core.index).

    Runs a replica stored (`add_later`) wait in a list until the window is read or added
    to, or until they are `_PENDING_BLOCKS` hashes: then they go in, in their order, in one
    stretch. Fed between the index's passes over its arrays, each run met a dict evicted
    from cache by them: 282 ns a hash in a 256-replica index's build, against 110-150 in
    one stretch."""

    def __init__(self, capacity_blocks: int):
        if capacity_blocks < 2:
            raise ValueError(f"SeenWindow: capacity_blocks must be >= 2, got {capacity_blocks}")
        self.capacity_blocks = capacity_blocks
        self._current: dict[BlockHash, None] = {}
        self._previous: dict[BlockHash, None] = {}
        self._later: list[Sequence[BlockHash]] = []  # runs not added yet, in order
        self._later_blocks = 0

    def add_later(self, block_hashes: Sequence[BlockHash]) -> None:
        """`add`, deferred until the window is next read or added to (same contents then)."""
        self._later.append(block_hashes)
        self._later_blocks += len(block_hashes)
        if self._later_blocks >= _PENDING_BLOCKS:
            self._add_pending()

    def _add_pending(self) -> None:
        later, self._later, self._later_blocks = self._later, [], 0
        for block_hashes in later:
            self._add(block_hashes)

    def num_leading_seen(self, block_hashes: Sequence[BlockHash]) -> int:
        """How many leading blocks of the prompt the window holds."""
        if self._later:
            self._add_pending()
        current, previous = self._current, self._previous
        n = num_leading_in(current, block_hashes)
        while n < len(block_hashes) and (block_hashes[n] in previous
                                         or block_hashes[n] in current):
            n += 1
        return n

    def add(self, block_hashes: Sequence[BlockHash]) -> None:
        """Remembers the hashes (of a long run, its last `capacity_blocks / 2` only): no
        generation ever holds more than half the capacity."""
        if self._later:
            self._add_pending()
        self._add(block_hashes)

    def _add(self, block_hashes: Sequence[BlockHash]) -> None:
        half = self.capacity_blocks // 2
        if len(block_hashes) > half:
            block_hashes = block_hashes[-half:]
        start = 0
        while start < len(block_hashes):
            room = half - len(self._current)
            if room <= 0:
                self._previous, self._current = self._current, {}
                room = half
            # pairs, not dict.fromkeys: no temporary dict (~25% less CPU a hash; this window
            # takes every stored block, a quarter of a fleet index's build)
            self._current.update(zip(block_hashes[start:start + room], repeat(None)))
            start += room

    def __len__(self) -> int:
        if self._later:
            self._add_pending()
        return len(self._current) + len(self._previous)


def _longest_elsewhere(matches: Mapping[str, PrefixMatch], replica_id: str) -> int:
    """The longest cached prefix, in blocks, of any candidate but `replica_id`: read off a
    walk's arrays as they are (no match object a replica), none at all for a prompt that no
    candidate had cached."""
    if not matches:
        return 0
    if isinstance(matches, PrefixMatches):
        return max((n for r, n in zip(matches.replica_ids, matches.cached_blocks.tolist())
                    if r != replica_id), default=0)
    return max((m.num_device_blocks + m.num_host_blocks
                for r, m in matches.items() if r != replica_id), default=0)


class _Decision(NamedTuple):
    block_hashes: Sequence[BlockHash]
    num_prompt_tokens: int
    matches: Mapping[str, PrefixMatch]  # every candidate's cached prefix at the decision


class MissCauses:
    """The router's miss causes: each outstanding request's view at its decision, totals of
    the ended ones.

    A decision only keeps references to what the router already built (the prompt's hashes,
    the candidates' matches); the window is read and fed when the request ends, off the
    decision's path, so "seen" means used by a request that ended earlier here, or stored
    by a replica (`on_events`, any router's request). Memory: the
    window's `seen_window_blocks` hashes, plus one entry per outstanding request (gone when
    it ends or is withdrawn: `forget`).
    """

    def __init__(self, block_size: int, seen_window_blocks: int):
        self.block_size = block_size
        self.seen = SeenWindow(seen_window_blocks)
        self.totals = MissTokens()  # requests that ended with a delivered count
        self._decisions: dict[str, _Decision] = {}

    def on_route(self, request_id: str, block_hashes: Sequence[BlockHash],
                 num_prompt_tokens: int, matches: Mapping[str, PrefixMatch]) -> None:
        """Keeps the request's view at its decision: `matches` holds every candidate with a
        cached prefix (another replica's is placement)."""
        self._decisions[request_id] = _Decision(block_hashes, num_prompt_tokens, matches)

    def on_end(self, request_id: str, replica_id: str, predicted_tokens: int,
               delivered_tokens: int | None) -> MissTokens | None:
        """The request ran on `replica_id`, predicted to find `predicted_tokens` cached there,
        and the engine served `delivered_tokens` from cache (None: it did not say; the
        prediction, as far as an engine can serve it, stands for it: no race): its causes,
        added to `totals` (None: no decision kept for it)."""
        decision = self._decisions.pop(request_id, None)
        if decision is None:
            return None
        hashes, n = decision.block_hashes, decision.num_prompt_tokens
        block_size = self.block_size
        cacheable = min(len(hashes) * block_size, n - 1)
        if delivered_tokens is None:
            delivered_tokens = max(min(predicted_tokens, cacheable), 0)
        # (in blocks, then tokens: split_causes caps it at the cacheable tokens)
        elsewhere = block_size * _longest_elsewhere(decision.matches, replica_id)
        seen_tokens = 0
        if max(predicted_tokens, elsewhere, delivered_tokens) < cacheable:
            seen_tokens = self.seen.num_leading_seen(hashes) * block_size
        self.seen.add(hashes)
        causes = split_causes(n, cacheable, predicted_tokens, elsewhere, seen_tokens,
                              delivered_tokens)
        self.totals = self.totals + causes
        return causes

    def on_events(self, events: Iterable[KVEvent]) -> None:
        """A replica stored blocks (its KV events, as every router applies them): they are
        seen, whichever router's request computed them, so a block another router's
        request used is not taken for cold."""
        for event in events:
            if type(event) is BlockStored:
                self.seen.add_later(event.block_hashes)

    def take(self, request_id: str) -> _Decision | None:
        """Removes and returns the request's view (to `keep` it again, as a moved request
        does)."""
        return self._decisions.pop(request_id, None)

    def keep(self, request_id: str, decision: _Decision) -> None:
        self._decisions[request_id] = decision

    def forget(self, request_id: str) -> None:
        """The request ended without a delivered count (refused, withdrawn, lost)."""
        self._decisions.pop(request_id, None)

    def num_outstanding(self) -> int:
        return len(self._decisions)
