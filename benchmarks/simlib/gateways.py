"""Several gateways in front of one simulated cluster: G routers, each with its own pending
marks, load count and routed history, all fed by the same event stream (kvroute serve's
ingress routers each run their own Router against one index actor).

How a request reaches a gateway (`SPREADS`):

    random       each request to one at random, as SO_REUSEPORT spreads connections
    round_robin  request n to gateway n mod G, in arrival order
    session      a session's first request round robin, each later round (a request that
                 continues another) to the gateway of the round it continues

What the gateways may share, each after a delay (the index actor relays it to the others in
their next long-poll reply):

    pending marks  the (replica, block hashes) a router marked pending for a request reach
                   the other routers, which apply them as timed marks (`pending_ttl_s`)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from benchmarks.simlib.workloads import WorkItem
from kv.hashing import BlockHash
from router.core.router import Router, RouterConfig, RoutingDecision

SPREADS = ("random", "round_robin", "session")


class SharedMarks(NamedTuple):
    """What one router tells the others it marked pending for a request."""

    origin: int  # the router's index
    replica_id: str
    block_hashes: tuple[BlockHash, ...]


class Gateways:
    """The routers, which one each request meets, and the marks they share.

    Args:
        config: every router's settings.
        num_routers: how many gateways.
        spread: one of `SPREADS`.
        seed: the random spread's draws.
        clock: the simulation's clock (drives the routers' pending marks and history).
    """

    def __init__(self, config: RouterConfig, num_routers: int, spread: str, seed: int,
                 clock: Callable[[], float]):
        if spread not in SPREADS:
            raise ValueError(f"unknown gateway spread {spread!r}; choose one of "
                             f"{', '.join(SPREADS)}")
        self.routers = [Router(config, clock=clock) for _ in range(num_routers)]
        self.spread = spread
        self._rng = np.random.default_rng([seed, 5])
        self._next = 0  # round robin's next gateway
        self._gateway_of: dict[str, int] = {}  # request id -> the gateway that routed it
        self.num_shared_messages = 0  # SharedMarks sent
        self.num_shared_blocks = 0  # block hashes in them

    def pick(self, item: WorkItem) -> int:
        """The gateway `item` reaches (and is routed and finished by)."""
        n = len(self.routers)
        if n == 1:
            i = 0
        elif self.spread == "session" and item.parent_id in self._gateway_of:
            i = self._gateway_of[item.parent_id]
        elif self.spread == "random":
            i = int(self._rng.integers(n))
        else:
            i, self._next = self._next, (self._next + 1) % n
        self._gateway_of[item.request_id] = i
        return i

    def router_of(self, request_id: str) -> Router:
        return self.routers[self._gateway_of[request_id]]

    def marks_to_share(self, origin: int, decision: RoutingDecision,
                       block_hashes: list[BlockHash]) -> SharedMarks | None:
        """The marks router `origin` just set for a request it routed: the prompt's blocks
        past the run events confirm on its replica (what `Router.route` marks pending); None
        when it set none (routed on history, or the whole prompt is confirmed there)."""
        if len(self.routers) == 1 or decision.approximate:
            return None
        router = self.routers[origin]
        num_confirmed = router.index.num_confirmed_device_blocks(decision.replica_id,
                                                                 block_hashes)
        if num_confirmed == len(block_hashes):
            return None
        self.num_shared_messages += 1
        self.num_shared_blocks += len(block_hashes) - num_confirmed
        return SharedMarks(origin, decision.replica_id, tuple(block_hashes[num_confirmed:]))

    def apply_shared(self, marks: SharedMarks) -> None:
        """Every other router marks the blocks pending on the replica for its TTL (a mark
        it holds for a request of its own stays held)."""
        for i, router in enumerate(self.routers):
            if i != marks.origin:
                router.index.mark_pending(marks.replica_id, marks.block_hashes)
