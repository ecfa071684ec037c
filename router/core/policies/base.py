"""The routing policy contract and what a policy sees of the world."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import ClassVar, NamedTuple, Protocol

import numpy as np

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
    # every candidate's `load` at once, as a float64 array (None: call `load` per replica)
    loads: Callable[[Sequence[str]], np.ndarray] | None = None


class Policy(Protocol):
    """Ranks the candidates for a request, best first.

    Contract:
      - `rank` returns every one of `query.replica_ids` exactly once (never another id),
        best first, and does not mutate the view. The first is the policy's choice; the
        rest are where the request should go, in that order, when the ones before are full
        (Ray Serve tries the ranks in turn). The router records the decision on the first
        (pending marks, load) afterwards, and moves it if the request lands further down.
      - `choose` is `rank(...)[0]`.
      - Given the same query, view and policy state (a counter, a seeded RNG), the ranking
        is the same: decisions are reproducible in tests and in the simulator.
      - `name` is a short constant used as the `policy` metric label.
      - `uses_index` tells the router whether to compute `view.matches` (the walk over the
        prompt's hashes) before calling `rank`.
      - `moved` hears that a ranked request runs on another replica than the first it
        ranked (that one was full): a policy that remembers where requests went updates it.
    """

    name: ClassVar[str]
    uses_index: ClassVar[bool]

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]: ...

    def choose(self, query: RouteQuery, view: ReplicaView) -> str: ...

    def moved(self, block_hashes: Sequence[BlockHash], replica_id: str) -> None: ...


class RankingPolicy:
    """`choose` from `rank` (the policies below implement `rank`)."""

    def rank(self, query: RouteQuery, view: ReplicaView) -> list[str]:
        raise NotImplementedError

    def choose(self, query: RouteQuery, view: ReplicaView) -> str:
        return self.rank(query, view)[0]

    def moved(self, block_hashes: Sequence[BlockHash], replica_id: str) -> None:
        """Nothing remembered: nothing to update."""


def by_load(replica_ids: Sequence[str], load: Callable[[str], float]) -> list[str]:
    """The candidates from least to most outstanding work; ties keep the listed order."""
    loads = [load(rid) for rid in replica_ids]
    order = sorted(range(len(replica_ids)), key=loads.__getitem__)
    return [replica_ids[i] for i in order]
