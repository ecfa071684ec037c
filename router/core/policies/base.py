"""The routing policy contract and what a policy sees of the world."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, NamedTuple, Protocol

from kv.hashing import BlockHash
from router.core.prefix_match import PrefixMatch


class RouteQuery(NamedTuple):
    request_id: str
    block_hashes: Sequence[BlockHash]  # Protocol 1 hashes of the prompt's full blocks
    num_prompt_tokens: int
    max_tokens: int  # decode tokens asked for (0 when unknown)
    replica_ids: Sequence[str]  # the candidates: non-empty, no duplicates


class ReplicaView(NamedTuple):
    """The router's view of the candidates at decision time.

    `matches` holds only candidates with at least one cached block (absent = no match); it
    is empty for a policy that does not use the index. `load` returns a replica's
    outstanding work in tokens (router.core.load).
    """

    matches: Mapping[str, PrefixMatch]
    load: Callable[[str], float]


class Policy(Protocol):
    """Chooses one replica for a request.

    Contract:
      - `choose` returns one of `query.replica_ids` (never another id) and does not mutate
        the view; the router records the decision (pending marks, load) afterwards.
      - Given the same query, view and policy state (a counter, a seeded RNG), the choice is
        the same: decisions are reproducible in tests and in the simulator.
      - `name` is a short constant used as the `policy` metric label.
      - `uses_index` tells the router whether to compute `view.matches` (the walk over the
        prompt's hashes) before calling `choose`.
    """

    name: ClassVar[str]
    uses_index: ClassVar[bool]

    def choose(self, query: RouteQuery, view: ReplicaView) -> str: ...


def least_loaded(replica_ids: Sequence[str], load: Callable[[str], float]) -> str:
    """The candidate with the least outstanding work; ties go to the earliest listed."""
    best_id, best_load = replica_ids[0], load(replica_ids[0])
    for rid in replica_ids[1:]:
        x = load(rid)
        if x < best_load:
            best_id, best_load = rid, x
    return best_id
