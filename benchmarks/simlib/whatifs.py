"""Router what-ifs: variants of the load model that were measured in the simulator, found
worse than the product's (benchmarks/NOTEBOOK.md, "Ladders with the new default" and
"Whole-prompt pins"), and kept out of the product's decision path. The simulator installs
`WhatIfRouter` in place of `Router` when a `WhatIfs` differs from the default; with the
default it runs the product's `Router` itself.

    recent_prefill_fraction      the share of a request's uncached prefill that joins its
                                 replica's recent work (its decode and cached-token work
                                 always do: a follow-up finds that prefill cached); 0.25
                                 fixed Mooncake at 2x and broke shared_prefix and
                                 conversation
    recent_prefill_followup_cap  that uncached prefill is at most a follow-up's (the running
                                 mean over requests that found at least half their prompt
                                 cached); worse on Mooncake 2x, shared_prefix, conversation
    recent_work_ends_when_idle   a replica's recent work ends when its published stats show
                                 it idle (approximate mode gets no stats: unaffected)
    first_token_signal           the gateway tells the router each request's first token
                                 (live serving has none: Ray Serve's router API reports
                                 routed and completed only); its prefill leaves the load
    running_decode_weight        the fraction of a running request's decode still counted
                                 (after its first token, and in the published stats)
    decode_charge_max_tokens     a request's decode charged as its max_tokens until it
                                 ends (the product charges the mean output when that is
                                 less); with clients sending each answer's exact length
                                 (sim_routing --max-tokens-sent exact), the oracle forecast
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from protocol.engine import EngineStats
from router.core.ledger import RouteRecord
from router.core.load import LoadTracker, bounded_tokens
from router.core.router import Router, RouterConfig

_FOLLOWUP_MEAN_ALPHA = 0.05  # weight of the newest follow-up in the mean of their prefills


@dataclass(frozen=True)
class WhatIfs:
    recent_prefill_fraction: float = 1.0
    recent_prefill_followup_cap: bool = False
    recent_work_ends_when_idle: bool = False
    first_token_signal: bool = False
    running_decode_weight: float = 1.0
    decode_charge_max_tokens: bool = False

    def __post_init__(self):
        for name in ("recent_prefill_fraction", "running_decode_weight"):
            if not 0 <= getattr(self, name) <= 1:
                raise ValueError(f"WhatIfs: {name} must be in [0, 1], got "
                                 f"{getattr(self, name)!r}")

    @property
    def is_default(self) -> bool:
        return self == WhatIfs()


def make_router(config: RouterConfig, whatifs: WhatIfs, clock: Callable[[], float]) -> Router:
    """The product's Router, or with any what-if set, a `WhatIfRouter`."""
    if whatifs.is_default:
        return Router(config, clock=clock)
    return WhatIfRouter(config, whatifs, clock)


class WhatIfLoads(LoadTracker):
    """The product's load, plus the what-ifs that change how work leaves it."""

    def __init__(self, config: RouterConfig, whatifs: WhatIfs, clock: Callable[[], float]):
        super().__init__(config.decode_weight, config.recent_work_half_life_s, clock)
        self.whatifs = whatifs
        self._first_token_tokens: dict[str, float] = {}  # the part that ends at the first token

    def add(self, request_id: str, replica_id: str, work_tokens: float, decode_tokens: float,
            recent_tokens: float | None = None, first_token_tokens: float = 0.0) -> None:
        super().add(request_id, replica_id, work_tokens, decode_tokens, recent_tokens)
        done = min(bounded_tokens(first_token_tokens), self._requests[request_id].work_tokens)
        if done:
            self._first_token_tokens[request_id] = done

    def finish(self, request_id: str, output_tokens: int | None = None) -> None:
        self._first_token_tokens.pop(request_id, None)
        super().finish(request_id, output_tokens)

    def decode_tokens(self, max_tokens: float, num_sequences: int = 1) -> float:
        if self.whatifs.decode_charge_max_tokens:
            return bounded_tokens(max_tokens)
        return super().decode_tokens(max_tokens, num_sequences)

    def first_token(self, request_id: str) -> None:
        """The request has its first token: its prefill work is done (unknown or already
        reported ids are ignored)."""
        done = self._first_token_tokens.pop(request_id, None)
        if done is None:
            return
        charge = self._requests[request_id]
        self._requests[request_id] = charge._replace(work_tokens=charge.work_tokens - done)
        self._local_tokens[charge.replica_id] -= done

    def first_token_part(self, request_id: str) -> float:
        return self._first_token_tokens.get(request_id, 0.0)

    def update_stats(self, replica_id: str, stats: EngineStats) -> None:
        super().update_stats(replica_id, stats)
        queued_tokens, num_running, num_waiting = self._stats[replica_id]
        # the published load counts running decode at running_decode_weight
        self._stats[replica_id] = (
            queued_tokens, self.whatifs.running_decode_weight * num_running, num_waiting)
        if self.whatifs.recent_work_ends_when_idle and not (stats.num_running
                                                             or stats.num_waiting):
            self._recent.pop(replica_id, None)

    def check_invariants(self) -> None:
        super().check_invariants()
        assert self._first_token_tokens.keys() <= self._requests.keys(), "stale first tokens"


class WhatIfRouter(Router):
    """`Router` with `WhatIfs` applied to the work a routed request adds."""

    def __init__(self, config: RouterConfig, whatifs: WhatIfs, clock: Callable[[], float]):
        super().__init__(config, clock)
        self.whatifs = whatifs
        self.loads: WhatIfLoads = WhatIfLoads(config, whatifs, clock)
        # running mean of the uncached prefill tokens of follow-ups (requests that found at
        # least half their prompt cached); None before the first one
        self._followup_uncached_tokens: float | None = None

    def _add_load(self, request_id: str, routed: RouteRecord, device_tokens: int,
                  host_tokens: int) -> None:
        whatifs = self.whatifs
        prefill_tokens, decode_tokens = self._work(routed, device_tokens, host_tokens)
        decode_work = self.config.decode_weight * decode_tokens
        work_tokens = prefill_tokens + decode_work
        recent_tokens = None
        if whatifs.recent_prefill_fraction != 1.0 or whatifs.recent_prefill_followup_cap:
            recent_tokens = self._recent_tokens(work_tokens, routed.num_prompt_tokens,
                                                device_tokens, host_tokens)
        first_token_tokens = (prefill_tokens + (1 - whatifs.running_decode_weight) * decode_work
                              if whatifs.first_token_signal else 0.0)
        self.loads.add(request_id, routed.replica_id, work_tokens, decode_tokens,
                       recent_tokens, first_token_tokens)

    def _recent_tokens(self, work_tokens: float, num_prompt_tokens: int, device_tokens: int,
                       host_tokens: int) -> float:
        """The part of a request's work that joins its replica's recent work when a what-if
        holds back some of its uncached prefill."""
        whatifs = self.whatifs
        uncached_tokens = num_prompt_tokens - device_tokens - host_tokens
        recent_uncached = whatifs.recent_prefill_fraction * uncached_tokens
        if whatifs.recent_prefill_followup_cap:
            mean = self._followup_uncached_tokens
            if device_tokens + host_tokens >= uncached_tokens:  # a follow-up
                mean = self._followup_uncached_tokens = (
                    uncached_tokens if mean is None
                    else mean + _FOLLOWUP_MEAN_ALPHA * (uncached_tokens - mean))
            if mean is not None:
                recent_uncached = min(recent_uncached, mean)
        return work_tokens - uncached_tokens + recent_uncached

    def on_first_token(self, request_id: str) -> None:
        """The request's first token came: its prefill leaves its replica's load, and its
        decode counts at `running_decode_weight` until `on_finished` (unknown ids are
        ignored)."""
        self.loads.first_token(request_id)
