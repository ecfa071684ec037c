"""The simulated cluster with faults injected: replicas killed mid-run, event
batches dropped, duplicated, delayed and so reordered, all from one seed."""

from __future__ import annotations

import random

from benchmarks.simlib.cluster import _DELIVER, ClusterConfig, ClusterSim
from benchmarks.simlib.replica import ReplicaConfig
from router.core.router import RouterConfig

CLEAR_ENDS = {"length", "stop", "error", "rejected"}


class FaultySim(ClusterSim):
    def __init__(self, config: ClusterConfig, workload, *, seed: int, drop: float = 0.1,
                 duplicate: float = 0.1, delay: float = 0.2, max_delay_s: float = 0.5,
                 kills: tuple[tuple[float, int], ...] = ()):
        super().__init__(config, workload)
        self.rng = random.Random(seed)
        self.drop, self.duplicate, self.delay, self.max_delay_s = drop, duplicate, delay, \
            max_delay_s
        self.kills = sorted(kills)  # (virtual time s, replica index)
        self.dead: set[int] = set()
        self.num_failed_by_kill = 0
        self.num_dropped = self.num_duplicated = self.num_delayed = 0

    # -- kills: checked at each arrival (the load drives the schedule) ---------------------

    def _on_arrival(self, item) -> None:
        while self.kills and self.kills[0][0] <= self.now:
            self._kill(self.kills.pop(0)[1])
        super()._on_arrival(item)

    def _kill(self, i: int) -> None:
        rep = self.replicas[i]
        if i in self.dead or len(self.replica_ids) == 1:
            return
        self.dead.add(i)
        self.replica_ids = [r for r in self.replica_ids if r != rep.replica_id]
        for request_id in list(rep.core.scheduler.requests):
            req = rep.core.finish(request_id, "error")  # its client gets a clear error
            if req is not None:
                self.num_failed_by_kill += 1
                self._finish(req)
        self.router.remove_replica(rep.replica_id)  # Serve reported the actor dead

    def _on_step_done(self, i: int) -> None:
        if i in self.dead:
            self.replicas[i]._plan = None
            return
        super()._on_step_done(i)

    # -- the event feed, faulty ------------------------------------------------------------

    def _on_publish(self, i: int) -> None:
        if i in self.dead:
            self._publish_due[i] = False
            return
        self._publish_due[i] = False
        rep = self.replicas[i]
        batch = rep.core.drain_events()
        copies = 1
        r = self.rng.random()
        if r < self.drop:
            copies, self.num_dropped = 0, self.num_dropped + 1
        elif r < self.drop + self.duplicate:
            copies, self.num_duplicated = 2, self.num_duplicated + 1
        for _ in range(copies):
            delay_s = self.config.event_delay_s
            if self.rng.random() < self.delay:
                delay_s += self.rng.uniform(0, self.max_delay_s)
                self.num_delayed += 1
            self._push(self.now + delay_s, _DELIVER, (i, batch, rep.core.stats()))
        if rep.is_busy or rep.core.has_work:
            self._mark_dirty(i)

    def _on_deliver(self, arg) -> None:
        if arg[0] in self.dead:
            return  # a batch in flight when its replica died
        super()._on_deliver(arg)

    def heal(self) -> None:
        """One fault-free publish per live replica (what the next publish interval does)."""
        for i, rep in enumerate(self.replicas):
            if i not in self.dead:
                self._on_deliver((i, rep.core.drain_events(), rep.core.stats()))

    def divergent_replicas(self) -> list[str]:
        """Live replicas whose router index differs from what they really hold."""
        out = []
        for i, rep in enumerate(self.replicas):
            if i in self.dead:
                continue
            kv = rep.core.kv
            if (self.router.index.blocks_of(rep.replica_id, "device") != set(kv.pool.cached)
                    or self.router.index.blocks_of(rep.replica_id, "host")
                    != set(kv.host.hashes())):
                out.append(rep.replica_id)
        return out

    def leaked(self) -> tuple[int, int]:
        """(outstanding requests the router still counts, held pending-mark sets)."""
        loads = self.router.loads
        return (sum(loads.num_outstanding(r.replica_id) for r in self.replicas),
                len(self.router.ledger))


def make_faulty(workload, num_replicas: int, seed: int, **faults) -> FaultySim:
    replica = ReplicaConfig(num_blocks=128, num_host_blocks=64, max_num_seqs=16,
                            max_num_batched_tokens=512, preset="tiny")
    router = RouterConfig(policy="cache_aware", approx_capacity_blocks=192)
    return FaultySim(ClusterConfig(num_replicas, replica, router, seed=seed), workload,
                     seed=seed, **faults)
