"""The pooled LRU's accesses of a simulated run, in order, to replay into other caches.

`record_run` runs the cluster simulator with a `PooledLRU` that also logs every call: a
routed prompt (`serve`: its block hashes and prompt tokens) and a finished sequence
(`release`: prompt and generated block hashes, and how many of them are the prompt's, which
is all a live router knows of it). Replaying the log into a `PooledLRU` of another size
gives the exact pooled bound at that size for the same requests in the same order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from benchmarks.simlib.cluster import ClusterConfig, ClusterSim
from benchmarks.simlib.miss_classes import MissCauseCheck, count_miss_causes, miss_causes_check
from benchmarks.simlib.pooled import PooledLRU
from benchmarks.simlib.workloads import Workload
from kv.hashing import BlockHash


@dataclass(frozen=True)
class Served:
    block_hashes: tuple[BlockHash, ...]
    num_prompt_tokens: int


@dataclass(frozen=True)
class Released:
    block_hashes: tuple[BlockHash, ...]  # the whole sequence: prompt, then generated
    num_prompt_blocks: int  # the first ones are the prompt's


class _LoggedLRU(PooledLRU):
    def __init__(self, capacity_blocks: int, block_size: int):
        super().__init__(capacity_blocks, block_size)
        self.log: list[Served | Released] = []
        self.num_prompt_blocks: int | None = None  # of the sequence about to be released

    def serve_prompt(self, block_hashes: Sequence[BlockHash], num_prompt_tokens: int) -> int:
        # serve_prompt releases the prompt through self.release: log it as one call
        self.log.append(Served(tuple(block_hashes), num_prompt_tokens))
        self.num_prompt_blocks = None
        return super().serve_prompt(block_hashes, num_prompt_tokens)

    def release(self, block_hashes: Sequence[BlockHash]) -> None:
        if self.num_prompt_blocks is not None:
            self.log.append(Released(tuple(block_hashes), self.num_prompt_blocks))
            self.num_prompt_blocks = None
        super().release(block_hashes)


class _LoggedSim(ClusterSim):
    def __init__(self, config: ClusterConfig, workload: Workload):
        super().__init__(config, workload)
        self.pooled = _LoggedLRU(self.pooled.capacity_blocks, self.pooled.block_size)

    def _finish(self, req) -> None:
        num_prompt_tokens = self.records[req.request_id].num_prompt_tokens
        self.pooled.num_prompt_blocks = num_prompt_tokens // self.config.replica.block_size
        super()._finish(req)


def record_run(config: ClusterConfig, workload: Workload
               ) -> tuple[list[Served | Released], float, MissCauseCheck]:
    """The run's pooled accesses in order, the simulator's own pooled hit ratio, and its
    routers' miss causes (benchmarks/simlib/miss_classes.py)."""
    sim = _LoggedSim(config, workload)
    count_miss_causes(sim)
    result = sim.run()
    return sim.pooled.log, result.pooled.hit_rate, miss_causes_check(sim, result)


def exact_hit_ratio(log: Sequence[Served | Released], capacity_blocks: int,
                    block_size: int) -> float:
    """The pooled LRU of `capacity_blocks` replaying the log."""
    lru = PooledLRU(capacity_blocks, block_size)
    for op in log:
        if isinstance(op, Served):
            lru.serve_prompt(op.block_hashes, op.num_prompt_tokens)
        else:
            lru.release(op.block_hashes)
    return lru.hit_rate
