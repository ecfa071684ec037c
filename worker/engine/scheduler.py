"""Continuous batching with chunked prefill over the prefix cache.

One `schedule()` builds a step: running requests first (decodes and unfinished prefill
chunks, oldest first), then waiting requests in arrival order while the token budget and
the block pool allow. The engine rules (docs/design.md, "Engine rules"), and where each
lives:

- The token budget counts only uncached tokens: cached prompt blocks are skipped by
  starting the request at `num_computed_tokens = cached tokens`.
- A fully cached prompt computes only its last token (its KV is not written again).
- A prefix nobody has computed yet is computed once: a waiting request whose next blocks
  another request is computing (`MatchResult.num_pending_blocks`) waits a step and hits.
- FCFS with no starvation: if the oldest waiting request does not fit, nobody behind it is
  admitted ahead of it (head-of-line), so freed blocks always go to it first.
- Preemption by recompute, newest first, when a running request cannot grow.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from kv.manager import KVCacheManager
from protocol.engine import SampledToken
from worker.engine.request import Request, RequestStatus
from worker.engine.step import ScheduledSeq, StepInput


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 64  # running requests at most
    max_num_batched_tokens: int = 2048  # tokens computed per step at most
    max_model_len: int = 2048  # prompt + output tokens at most
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_model_len"):
            if getattr(self, name) <= 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")


@dataclass(frozen=True)
class SchedulerOutput:
    step: StepInput
    preempted_ids: list[str]
    admitted_ids: list[str]

    @property
    def is_empty(self) -> bool:
        return not self.step.seqs


class Scheduler:
    def __init__(self, config: SchedulerConfig, kv: KVCacheManager):
        self.config = config
        self.kv = kv
        self.block_size = kv.block_size
        self.requests: dict[str, Request] = {}
        self.waiting: deque[Request] = deque()
        self.running: list[Request] = []
        self.num_preemptions = 0

    # -- requests in and out ---------------------------------------------------------------

    def add(self, req: Request) -> None:
        if req.request_id in self.requests:
            raise ValueError(f"duplicate request id {req.request_id!r}")
        self.requests[req.request_id] = req
        self.waiting.append(req)

    def finish(self, request_id: str, reason: str) -> Request | None:
        """Ends a request (abort, stop string, error) and frees its blocks."""
        req = self.requests.pop(request_id, None)
        if req is None:
            return None
        if req.status is RequestStatus.RUNNING:
            self.running.remove(req)
        elif req.status is RequestStatus.WAITING:
            self.waiting.remove(req)
        self.kv.free(request_id)
        req.status = RequestStatus.FINISHED
        req.finish_reason = reason
        return req

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # -- scheduling ------------------------------------------------------------------------

    def schedule(self) -> SchedulerOutput:
        budget = self.config.max_num_batched_tokens
        seqs: list[ScheduledSeq] = []
        preempted: list[str] = []

        i = 0
        while i < len(self.running) and budget > 0:
            req = self.running[i]
            num_new = min(req.num_tokens - req.num_computed_tokens, budget)
            block_ids = self._grow(req, num_new, preempted)
            if block_ids is None:  # preempted itself: everything after it is gone too
                break
            seqs.append(self._seq(req, num_new, block_ids, skip_kv_write=0))
            budget -= num_new
            i += 1

        admitted: list[str] = []
        if not preempted:
            budget = self._admit(budget, seqs, admitted)

        step = StepInput(seqs, self.kv.take_copy_plan())
        return SchedulerOutput(step, preempted, admitted)

    def _grow(self, req: Request, num_new: int, preempted: list[str]) -> list[int] | None:
        """Blocks for `num_new` more tokens of a running request, preempting the newest
        running requests (possibly `req` itself, then None) until they fit."""
        while True:
            block_ids = self.kv.allocate(req.request_id, req.num_computed_tokens + num_new,
                                         req.block_hashes)
            if block_ids is not None:
                return block_ids
            victim = self.running.pop()
            self._preempt(victim)
            preempted.append(victim.request_id)
            if victim is req:
                return None

    def _preempt(self, req: Request) -> None:
        self.kv.free(req.request_id)
        req.status = RequestStatus.WAITING
        req.num_computed_tokens = 0
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)  # newest preempted first, so older ones end up ahead

    def _admit(self, budget: int, seqs: list[ScheduledSeq], admitted: list[str]) -> int:
        deferred: list[Request] = []  # waiting on a prefix another request is computing
        while self.waiting and budget > 0 and len(self.running) < self.config.max_num_seqs:
            req = self.waiting[0]
            match = self.kv.match(req.block_hashes)
            if match.num_pending_blocks:
                deferred.append(self.waiting.popleft())
                continue
            num_cached = min(match.num_cached_blocks * self.block_size, req.num_tokens)
            # A fully cached prompt still computes its last token, to get logits.
            start = min(num_cached, req.num_tokens - 1)
            num_new = min(req.num_tokens - start, budget)
            if not self.kv.can_allocate(req.request_id, start + num_new, req.block_hashes,
                                        match):
                break  # head-of-line: nobody overtakes the oldest waiting request
            block_ids = self.kv.allocate(req.request_id, start + num_new, req.block_hashes,
                                         match)
            assert block_ids is not None, "can_allocate promised room"
            self.waiting.popleft()
            num_device = min(match.num_device_blocks * self.block_size, start)
            if req.num_preemptions == 0:
                req.num_cached_device_tokens = num_device
                req.num_cached_host_tokens = start - num_device
                self.kv.stats.record(req.num_tokens, num_device, start - num_device)
            req.num_computed_tokens = start
            req.status = RequestStatus.RUNNING
            if req.first_scheduled_time is None:
                req.first_scheduled_time = time.monotonic()
            self.running.append(req)
            admitted.append(req.request_id)
            seqs.append(self._seq(req, num_new, block_ids,
                                  skip_kv_write=num_cached - start))
            budget -= num_new
        self.waiting.extendleft(reversed(deferred))
        return budget

    def _seq(self, req: Request, num_new: int, block_ids: list[int],
             skip_kv_write: int) -> ScheduledSeq:
        start = req.num_computed_tokens
        return ScheduledSeq(
            request_id=req.request_id,
            token_ids=req.token_ids[start : start + num_new],
            start_pos=start,
            block_ids=block_ids,
            sample=start + num_new == req.num_tokens,
            skip_kv_write=skip_kv_write,
            num_output_tokens=req.num_output_tokens,
        )

    # -- results ---------------------------------------------------------------------------

    def update(self, step: StepInput, sampled: Mapping[str, SampledToken]) -> list[Request]:
        """Applies a finished step: computed tokens, new blocks to cache, sampled tokens and
        stop conditions. Returns the requests that got a token or finished."""
        out: list[Request] = []
        for seq in step.seqs:
            req = self.requests.get(seq.request_id)
            if req is None or req.status is not RequestStatus.RUNNING:
                continue  # finished or preempted while the step ran
            req.num_computed_tokens = seq.start_pos + len(seq.token_ids)
            self.kv.cache_blocks(req.request_id, req.block_hashes, req.num_computed_tokens,
                                 req.token_ids)
            if not seq.sample:
                continue
            token_id = sampled[req.request_id].token_id
            req.append_token(token_id)
            reason = self._stop_reason(req, token_id)
            if reason is not None:
                self.finish(req.request_id, reason)
            out.append(req)
        return out

    def _stop_reason(self, req: Request, token_id: int) -> str | None:
        sp = req.sampling
        if req.num_output_tokens > sp.min_tokens:  # min_tokens: EOS and stop tokens wait
            if token_id in sp.stop_token_ids:
                return "stop"
            if not sp.ignore_eos and token_id in self.config.eos_token_ids:
                return "stop"
        if req.num_output_tokens >= sp.max_tokens or req.num_tokens >= self.config.max_model_len:
            return "length"
        return None

    # -- introspection ---------------------------------------------------------------------

    def num_queued_prefill_tokens(self) -> int:
        """Prompt tokens still to compute. A waiting request's cached prefix is not work:
        counting it made the replicas that hold the cache look busiest to the router."""
        running = sum(r.num_tokens - r.num_computed_tokens for r in self.running
                      if r.num_computed_tokens < r.num_tokens - 1)
        waiting = 0
        for r in self.waiting:
            num_cached = self.kv.match(r.block_hashes).num_cached_blocks * self.block_size
            waiting += r.num_tokens - min(num_cached, r.num_tokens - 1)
        return running + waiting

    def check_invariants(self) -> None:
        self.kv.check_invariants()
        ids = [r.request_id for r in self.running] + [r.request_id for r in self.waiting]
        assert len(ids) == len(set(ids)) == len(self.requests), "request lists disagree"
        for r in self.running:
            assert r.status is RequestStatus.RUNNING and r.request_id in self.kv
        for r in self.waiting:
            assert r.status is RequestStatus.WAITING and r.request_id not in self.kv
