"""The synchronous engine core: KV manager, scheduler and event log, one step at a time.

Both drivers of a replica run this one core, so the simulator runs the engine's own code:
the async Engine (worker/engine/engine.py) on its event loop with the forward pass in a worker
thread, the simulator's replica (benchmarks/simlib/replica.py) on a virtual clock. Per step:

    plan, unfit = core.plan_step()       # unfit: finished with "error", report them
    sampled = executor.execute(plan.step, plan.sampling)
    core.update(plan.step, sampled)      # or core.fail_step(plan.step) if execute raised

A request whose own sampling failed (a SampleFailure in `sampled`) ends alone, with
"error"; the step is applied for every other request.

The core never computes anything and never blocks; the driver owns time and the executor.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from kv.events import EventBatch, EventLog, Snapshot
from kv.hashing import BlockHash
from kv.manager import KVCacheConfig, KVCacheManager
from protocol.engine import EngineStats, SampledToken, SampleFailure, SamplingParams
from worker.engine.request import Request
from worker.engine.scheduler import Scheduler, SchedulerConfig
from worker.engine.step import StepInput


@dataclass(frozen=True)
class StepPlan:
    step: StepInput  # never empty: at least one seq
    sampling: dict[str, SamplingParams]  # of exactly the seqs with sample=True


class EngineCore:
    def __init__(self, kv_config: KVCacheConfig, scheduler_config: SchedulerConfig,
                 event_log: EventLog):
        self.event_log = event_log
        self.kv = KVCacheManager(kv_config, event_log)
        self.scheduler = Scheduler(scheduler_config, self.kv)

    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def add(self, req: Request) -> None:
        self.scheduler.add(req)

    def finish(self, request_id: str, reason: str) -> Request | None:
        """Ends a request (abort, stop string, error) and frees its blocks; None when it
        is not here (already finished)."""
        return self.scheduler.finish(request_id, reason)

    def plan_step(self) -> tuple[StepPlan | None, list[Request]]:
        """Schedules the next step: None when nothing is left to run.

        A waiting request that cannot run on an otherwise idle step can never fit this
        replica (it needs more blocks than the pool has): it is finished with "error" and
        returned in the second list, so the driver tells its client, and scheduling goes on.
        """
        unfit: list[Request] = []
        scheduler = self.scheduler
        while scheduler.has_work:
            out = scheduler.schedule()
            if out.is_empty:
                req = scheduler.finish(scheduler.waiting[0].request_id, "error")
                assert req is not None, "the head of the waiting queue is a known request"
                unfit.append(req)
                continue
            requests = scheduler.requests
            sampling = {s.request_id: requests[s.request_id].sampling
                        for s in out.step.seqs if s.sample}
            return StepPlan(out.step, sampling), unfit
        return None, unfit

    def update(self, step: StepInput, sampled: Mapping[str, SampledToken | SampleFailure]
               ) -> list[Request]:
        """Applies a computed step; returns the requests that got a token or finished. A
        request whose sampling failed is finished with "error" first (its blocks freed), so
        the scheduler skips it like one aborted while the step ran."""
        failed = [self.scheduler.finish(rid, "error") for rid, out in sampled.items()
                  if isinstance(out, SampleFailure)]
        tokens = {rid: out for rid, out in sampled.items() if isinstance(out, SampledToken)}
        return [r for r in failed if r is not None] + self.scheduler.update(step, tokens)

    def fail_step(self, step: StepInput) -> list[Request]:
        """A step whose compute failed: finishes its requests with "error" and returns
        them (those already finished while it ran are left out). The step's block copies
        may not have run: the cache entries they were to fill are dropped."""
        self.kv.abort_copy_plan(step.copies)
        failed = (self.scheduler.finish(seq.request_id, "error") for seq in step.seqs)
        return [req for req in failed if req is not None]

    # -- pinned prefixes -------------------------------------------------------------------

    def pin(self, name: str, block_hashes: Sequence[BlockHash]) -> int | None:
        """Pins cached device blocks; None when they are not all cached or over budget."""
        return self.kv.pin(name, block_hashes)

    def unpin(self, name: str) -> bool:
        return self.kv.unpin(name)

    # -- what the replica publishes --------------------------------------------------------

    def stats(self) -> EngineStats:
        usage = self.kv.usage()
        return EngineStats(
            num_running=len(self.scheduler.running), num_waiting=len(self.scheduler.waiting),
            num_queued_prefill_tokens=self.scheduler.num_queued_prefill_tokens(),
            num_blocks=self.kv.pool.num_blocks, num_used_blocks=usage["used"],
            num_cached_blocks=usage["cached"], num_pinned_blocks=usage["pinned"],
            num_free_blocks=usage["free"], num_host_blocks=self.kv.host.num_blocks,
            num_host_cached_blocks=len(self.kv.host))

    def drain_events(self) -> EventBatch:
        return self.event_log.drain()

    def snapshot(self) -> Snapshot:
        return self.kv.snapshot()

    def check_invariants(self) -> None:
        self.scheduler.check_invariants()
