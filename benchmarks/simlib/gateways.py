"""Several gateways in front of one simulated cluster: G routers, each with its own pending
marks, load count and routed history, all fed by the same event stream (kvroute serve's
ingress routers each run their own Router against one index actor).

How a request reaches a gateway (`SPREADS`):

    random       each request to one at random, as SO_REUSEPORT spreads connections
    round_robin  request n to gateway n mod G, in arrival order
    session      a session's first request round robin, each later round (a request that
                 continues another) to the gateway of the round it continues

What the gateways may share, each reaching the other routers a delay later (the index actor
relays it in their next long-poll reply):

    pending marks  a decision's replica and prompt block hashes (the first
                   `MAX_SHARED_MARK_BLOCKS`); a receiver marks the blocks past the run its
                   own index confirms there, as timed marks (`pending_ttl_s`), as
                   router/cluster/mark_sharing.py does live
    routed work    a decision's work tokens on its replica, then its end: the receivers
                   count it in their load as their own until it ends (no live counterpart)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import numpy as np

from benchmarks.simlib.whatifs import WhatIfLoads, WhatIfs, make_router
from benchmarks.simlib.workloads import WorkItem
from kv.hashing import BlockHash
from router.core.router import Router, RouterConfig, RoutingDecision

SPREADS = ("random", "round_robin", "session")
MAX_SHARED_MARK_BLOCKS = 4096  # router/cluster/mark_sharing.py's max_mark_blocks


class SharedRoute(NamedTuple):
    """What one router tells the others about a request it routed."""

    origin: int  # the router's index
    request_id: str
    replica_id: str
    block_hashes: tuple[BlockHash, ...]  # () when marks are not shared
    # the load's (work tokens, decode tokens, first-token part, recent part); None when
    # routed work is not shared
    work: tuple[float, float, float, float] | None


class SharedEnd(NamedTuple):
    """A request's end (or its first token), for the routers that count its work."""

    origin: int
    request_id: str
    first_token: bool  # only its prefill ended
    output_tokens: int | None = None  # at its end: what it produced


class Gateways:
    """The routers, which one each request meets, and what they share.

    Args:
        config: every router's settings.
        num_routers: how many gateways.
        spread: one of `SPREADS`.
        seed: the random spread's draws.
        clock: the simulation's clock (drives the routers' pending marks and history).
        share_marks, share_work: what `shared_route` returns.
        whatifs: the routers' what-ifs (benchmarks/simlib/whatifs.py); none by default.
    """

    def __init__(self, config: RouterConfig, num_routers: int, spread: str, seed: int,
                 clock: Callable[[], float], share_marks: bool = False,
                 share_work: bool = False, whatifs: WhatIfs | None = None):
        if spread not in SPREADS:
            raise ValueError(f"unknown gateway spread {spread!r}; choose one of "
                             f"{', '.join(SPREADS)}")
        whatifs = WhatIfs() if whatifs is None else whatifs
        self.routers = [make_router(config, whatifs, clock) for _ in range(num_routers)]
        self.spread = spread
        self.share_marks = share_marks and num_routers > 1
        self.share_work = share_work and num_routers > 1
        self._rng = np.random.default_rng([seed, 5])
        self._next = 0  # round robin's next gateway
        self._gateway_of: dict[str, int] = {}  # request id -> the gateway that routed it
        self.num_shared_routes = 0  # SharedRoute messages sent
        self.num_shared_blocks = 0  # block hashes in them
        self.num_marked_blocks = 0  # hashes the receivers marked (past their confirmed run)

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

    def shared_route(self, request_id: str, decision: RoutingDecision,
                     block_hashes: list[BlockHash], max_tokens: int) -> SharedRoute | None:
        """What the request's router shares of its decision; None when it shares nothing."""
        if not (self.share_marks or self.share_work):
            return None
        origin = self._gateway_of[request_id]
        marks = tuple(block_hashes[:MAX_SHARED_MARK_BLOCKS]) if self.share_marks else ()
        work = None
        if self.share_work:
            # The router keeps a request's work private; read it as the router would send it.
            loads = self.routers[origin].loads
            charge = loads._requests[request_id]
            first_token_tokens = (loads.first_token_part(request_id)
                                  if isinstance(loads, WhatIfLoads) else 0.0)
            work = (charge.work_tokens, charge.decode_tokens, first_token_tokens,
                    charge.recent_tokens)
        self.num_shared_routes += 1
        self.num_shared_blocks += len(marks)
        return SharedRoute(origin, request_id, decision.replica_id, marks, work)

    def shared_end(self, request_id: str, first_token: bool,
                   output_tokens: int | None = None) -> SharedEnd | None:
        if not self.share_work:
            return None
        return SharedEnd(self._gateway_of[request_id], request_id, first_token, output_tokens)

    def apply(self, message: SharedRoute | SharedEnd) -> None:
        """Every router but the sender applies the message."""
        for i, router in enumerate(self.routers):
            if i == message.origin:
                continue
            if isinstance(message, SharedEnd):
                if message.first_token:
                    router.loads.first_token(message.request_id)
                else:
                    router.loads.finish(message.request_id, message.output_tokens)
                continue
            replica_id, block_hashes = message.replica_id, message.block_hashes
            if block_hashes and not router.is_approximate(replica_id):
                k = router.index.num_confirmed_device_blocks(replica_id, block_hashes)
                if k < len(block_hashes):
                    router.index.mark_pending(replica_id, block_hashes[k:])
                    self.num_marked_blocks += len(block_hashes) - k
            if message.work is not None:
                work_tokens, decode_tokens, first_token_tokens, recent_tokens = message.work
                if isinstance(router.loads, WhatIfLoads):
                    router.loads.add(message.request_id, replica_id, work_tokens,
                                     decode_tokens, recent_tokens, first_token_tokens)
                else:
                    router.loads.add(message.request_id, replica_id, work_tokens,
                                     decode_tokens, recent_tokens)
