"""One engine replica: the engine core (worker/engine/core.py) + an executor behind an
async API.

The step loop runs on the event loop that first calls `generate`; each step's compute runs
in one worker thread so the loop keeps accepting requests and streaming tokens. The core
(scheduler and KV state) is touched only on the event loop.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from concurrent.futures import ThreadPoolExecutor

from kv.events import EventBatch, EventLog, Snapshot
from kv.hashing import block_hashes, namespace_root
from kv.manager import KVCacheConfig
from protocol.engine import (
    EngineInputError,
    EngineRequest,
    EngineStats,
    EngineUnavailableError,
    EngineUnhealthyError,
    PinnedPrefix,
    SampleFailure,
    SamplingParams,
    TokenDelta,
    TokenLogprobs,
    Usage,
)
from worker.engine.config import EngineConfig
from worker.engine.core import EngineCore
from worker.engine.metrics import EngineMetrics
from worker.engine.request import Request
from worker.engine.request_output import RequestOutput
from worker.engine.scheduler import SchedulerConfig
from worker.executor.executor import Executor
from worker.tokenizer.detokenizer import IncrementalDetokenizer

log = logging.getLogger(__name__)

# What a client (and the unauthenticated /health) is told of a failed step: a stable text,
# never the exception's (it may name hosts, paths, or another request's values); the
# replica's log has the exception with its traceback.
STEP_FAILED = "a step that ran this request failed (the replica logged why)"


class Engine:
    def __init__(self, config: EngineConfig, executor: Executor, tokenizer,
                 max_model_len: int):
        self.config = config
        self.executor = executor
        self.tokenizer = tokenizer
        self.model_name = config.served_model_name
        self.max_model_len = min(max_model_len, config.num_blocks * config.block_size)
        self.core = EngineCore(
            KVCacheConfig(num_blocks=config.num_blocks, block_size=config.block_size,
                          num_host_blocks=config.num_host_blocks,
                          enable_prefix_caching=config.enable_prefix_caching,
                          pin_budget_blocks=config.pin_budget_blocks),
            SchedulerConfig(max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.max_num_batched_tokens,
                            max_model_len=self.max_model_len,
                            eos_token_ids=executor.eos_token_ids),
            EventLog(config.replica_id))
        self.metrics = EngineMetrics(self.model_name, config.replica_id)
        self.registry = self.metrics.registry
        # each request's undelivered output, merged until its consumer takes it
        self._outputs: dict[str, RequestOutput] = {}
        self._detok: dict[str, IncrementalDetokenizer] = {}
        # pins being computed, by request id: (pin, its block hashes, its outcome)
        self._pins: dict[str, tuple[PinnedPrefix, list[bytes], asyncio.Future[int]]] = {}
        self._pinned: dict[str, PinnedPrefix] = {}  # what is pinned now, by name
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None
        self._thread = ThreadPoolExecutor(1, thread_name_prefix=f"step-{config.replica_id}")
        self._closed = False
        self._idle = asyncio.Event()  # set while the loop has nothing to do
        self._roots: dict[tuple[str, str], bytes] = {}
        self._num_failed_steps = 0  # consecutive; any step that succeeds resets it
        # told each finished sequence's block hashes (prompt and generated blocks): the
        # serving layer samples them for the pooled bound
        self.on_finished: Callable[[list[bytes]], None] | None = None
        self._update_metrics()  # every gauge exists from the start, not after a first step

    @classmethod
    def from_config(cls, config: EngineConfig) -> Engine:
        from worker.engine.factory import build_engine

        return build_engine(config)

    # -- public API ------------------------------------------------------------------------

    async def generate(self, request: EngineRequest) -> AsyncIterator[TokenDelta]:
        """Streams the request's token deltas; the last one has finish_reason and usage.

        Raises EngineInputError before streaming when the request cannot be served.
        Closing the iterator early (client gone) aborts the request.
        """
        req = self._admit(request)
        deltas = self._drain(req.request_id)
        try:
            async for delta in deltas:
                yield delta
        finally:
            await deltas.aclose()  # now, not at garbage collection: aborts if unfinished

    def abort(self, request_id: str) -> None:
        req = self.core.finish(request_id, "abort")
        if req is not None:
            self._emit(req, None, "", "abort")

    async def pin_prefix(self, name: str, token_ids: list[int], cache_salt: str = "",
                         adapter: str = "") -> int:
        """Computes a prefix and pins its full blocks. Returns the number of blocks pinned.

        Raises EngineInputError when the prefix is shorter than a block or over budget.
        """
        if len(token_ids) < self.config.block_size:
            raise EngineInputError(f"prefix {name!r} is shorter than one block "
                                   f"({self.config.block_size} tokens)")
        request = EngineRequest(f"pin-{name}-{uuid.uuid4().hex[:8]}", list(token_ids),
                                SamplingParams(max_tokens=1, temperature=0),
                                adapter=adapter, cache_salt=cache_salt)
        req = self._admit(request)
        done: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        pin = PinnedPrefix(name, cache_salt, tuple(token_ids), 0)
        self._pins[req.request_id] = (pin, list(req.block_hashes), done)
        async for _ in self._drain(req.request_id):
            pass
        return await done

    def unpin_prefix(self, name: str) -> bool:
        self._pinned.pop(name, None)
        unpinned = self.core.unpin(name)
        self._update_metrics()  # the block gauges move now, not at the next step
        return unpinned

    def stats(self) -> EngineStats:
        return self.core.stats()

    def pinned_prefixes(self) -> tuple[PinnedPrefix, ...]:
        return tuple(self._pinned.values())

    def drain_events(self) -> EventBatch:
        return self.core.drain_events()

    def namespaces(self) -> list[tuple[str, str]]:
        """The (adapter, cache salt) pairs of the requests admitted so far: the namespace
        roots this engine's block hashes start from (a vLLM-format publisher names them)."""
        return list(self._roots)

    def snapshot(self) -> Snapshot:
        return self.core.snapshot()

    def check_health(self, max_failed_steps: int = 3) -> None:
        """Raises EngineUnhealthyError when the engine cannot serve: its step loop died, or
        its last `max_failed_steps` steps all failed (a lost TP rank fails every step). A
        single failed step only fails that step's requests."""
        task = self._loop_task
        if task is not None and task.done() and not task.cancelled() and task.exception():
            raise EngineUnhealthyError("the engine step loop died (the replica logged why)")
        if self._num_failed_steps >= max_failed_steps:
            raise EngineUnhealthyError(f"the last {self._num_failed_steps} engine steps "
                                       "failed (the replica logged why)")

    async def shutdown(self) -> None:
        """Finishes what was accepted, then stops the loop and the executor."""
        while self.core.has_work and self._loop_task and not self._loop_task.done():
            await self._idle.wait()
        self._closed = True
        self._wake.set()
        if self._loop_task is not None:
            await self._loop_task
        self._thread.shutdown(wait=True)
        self.executor.shutdown()

    # -- admission -------------------------------------------------------------------------

    def _admit(self, request: EngineRequest) -> Request:
        if self._closed:
            raise EngineUnavailableError("the engine is shutting down")
        self._validate(request)
        root = self._root(request.adapter, request.cache_salt)
        req = Request(request.request_id, request.prompt_token_ids, request.sampling,
                      self.config.block_size, root, request.block_hashes)
        self.core.add(req)
        self._outputs[req.request_id] = RequestOutput(req.request_id)
        self._detok[req.request_id] = IncrementalDetokenizer(
            self.tokenizer, request.sampling.stop, request.sampling.min_tokens)
        self.metrics.series(self.metrics.prompt_tokens).inc(req.num_prompt_tokens)
        self._ensure_loop()
        self._wake.set()
        return req

    def _validate(self, request: EngineRequest) -> None:
        n = len(request.prompt_token_ids)
        if n == 0:
            raise EngineInputError("the prompt is empty")
        if n >= self.max_model_len:
            raise EngineInputError(
                f"the prompt has {n} tokens; this model's context is {self.max_model_len} "
                "tokens, including at least one generated token")
        vocab = self.executor.vocab_size
        if any(not 0 <= t < vocab for t in request.prompt_token_ids):
            raise EngineInputError(f"prompt token ids must be in [0, {vocab})")
        if any(not 0 <= t < vocab for t in request.sampling.stop_token_ids):
            raise EngineInputError(f"stop_token_ids must be in [0, {vocab})")
        if request.request_id in self.core.scheduler.requests:
            raise EngineInputError(f"duplicate request id {request.request_id!r}")
        self._check_fits_beside_pins(request)
        expected = n // self.config.block_size
        if request.block_hashes is not None and len(request.block_hashes) != expected:
            raise EngineInputError(f"block_hashes has {len(request.block_hashes)} entries; a "
                                   f"{n}-token prompt has {expected} full blocks")

    def _check_fits_beside_pins(self, request: EngineRequest) -> None:
        """Pins shrink the pool: a prompt that cannot fit beside them would block the head of
        the queue, then fail; refuse it now with the reason."""
        kv = self.core.kv
        if not kv.num_pinned_blocks:
            return
        root = self._root(request.adapter, request.cache_salt)
        hashes = request.block_hashes
        if hashes is None:
            hashes = block_hashes(request.prompt_token_ids, self.config.block_size, root)
        num_needed, num_free = kv.num_blocks_beside_pins(len(request.prompt_token_ids) + 1,
                                                         hashes)
        if num_needed > num_free:
            raise EngineInputError(
                f"the prompt needs {num_needed} KV blocks; this replica has {num_free} "
                f"besides its {kv.num_pinned_blocks} pinned blocks")

    def _root(self, adapter: str, salt: str) -> bytes:
        key = (adapter, salt)
        if key not in self._roots:
            self._roots[key] = namespace_root(self.model_name, adapter, salt)
        return self._roots[key]

    async def _drain(self, request_id: str) -> AsyncIterator[TokenDelta]:
        output = self._outputs[request_id]
        try:
            while True:
                delta = await output.take()  # all the steps since the last take, merged
                yield delta
                if delta.finish_reason is not None:
                    return
        finally:
            if request_id in self.core.scheduler.requests:  # the consumer left early
                self.abort(request_id)
            self._forget(request_id)

    def _forget(self, request_id: str) -> None:
        self._outputs.pop(request_id, None)
        self._detok.pop(request_id, None)
        self.executor.release(request_id)

    # -- the step loop ---------------------------------------------------------------------

    def _ensure_loop(self) -> None:
        if self._loop_task is None or self._loop_task.done():
            self._loop_task = asyncio.get_running_loop().create_task(self._run())
            self._loop_task.add_done_callback(_log_loop_death)

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closed:
            if not self.core.has_work:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            self._idle.clear()
            plan, unfit = self.core.plan_step()
            for req in unfit:
                self._on_failed(req, f"request needs more KV blocks than this replica has "
                                     f"({self.core.kv.pool.num_blocks})")
            if plan is None:
                continue
            try:
                sampled = await loop.run_in_executor(self._thread, self.executor.execute,
                                                     plan.step, plan.sampling)
            except Exception:  # the step failed: fail its requests, keep serving
                log.exception("step failed")
                self._num_failed_steps += 1
                for req in self.core.fail_step(plan.step):
                    self._on_failed(req, STEP_FAILED)
                continue
            self._num_failed_steps = 0
            num_tokens = 0
            for req in self.core.update(plan.step, sampled):
                out = sampled[req.request_id]
                if isinstance(out, SampleFailure):  # its own sampling: it alone ends
                    self._on_failed(req, out.error)
                    continue
                self._on_token(req, out.logprobs)
                num_tokens += 1
            # once per step, not per token
            self.metrics.series(self.metrics.generation_tokens).inc(num_tokens)
            self._update_metrics()
        self._idle.set()

    def _on_token(self, req: Request, logprobs: TokenLogprobs | None) -> None:
        now = time.monotonic()
        if req.first_token_time is None:
            req.first_token_time = now
            self.metrics.series(self.metrics.ttft).observe(now - req.arrival_time)
            output = self._outputs.get(req.request_id)
            if output is not None and req.first_scheduled_time is not None:
                output.first_token_compute_s = now - req.first_scheduled_time
        detok = self._detok.get(req.request_id)
        text, hit_stop = "", False
        if detok is not None:
            text, hit_stop = detok.step(req.output_token_ids, req.is_finished)
        if hit_stop and not req.is_finished:
            self.core.finish(req.request_id, "stop")
        self._emit(req, req.token_ids[-1], text, req.finish_reason, logprobs)

    def _emit(self, req: Request, token_id: int | None, text: str,
              finish_reason: str | None, logprobs: TokenLogprobs | None = None) -> None:
        """Hands the request's new token (None: no token, e.g. an abort) to its output."""
        usage = None
        if finish_reason is not None:
            usage = Usage(req.num_prompt_tokens, req.num_output_tokens,
                          req.num_cached_device_tokens, req.num_cached_host_tokens)
            self.metrics.series(self.metrics.finished, reason=finish_reason).inc()
            now = time.monotonic()
            self.metrics.series(self.metrics.e2e).observe(now - req.arrival_time)
            if req.first_token_time is not None and req.num_output_tokens > 1:
                self.metrics.series(self.metrics.tpot).observe(
                    (now - req.first_token_time) / (req.num_output_tokens - 1))
            self._finish_pin(req)
            if self.on_finished is not None:
                self.on_finished(req.block_hashes)
        output = self._outputs.get(req.request_id)
        if output is not None and not output.finished:
            output.put(token_id, text, finish_reason, usage, logprobs=logprobs)

    def _finish_pin(self, req: Request) -> None:
        pin = self._pins.pop(req.request_id, None)
        if pin is None:
            return
        pinned, hashes, done = pin
        name = pinned.name
        # The prefix's blocks were just freed into the cache; nothing ran since, so they are
        # all still there.
        n = self.core.pin(name, hashes) if req.finish_reason != "abort" else None
        if n is None:
            done.set_exception(EngineInputError(
                f"prefix {name!r} ({len(hashes)} blocks) does not fit the pin budget of "
                f"{self.config.pin_budget_blocks} blocks"))
        else:
            self._pinned[name] = dataclasses.replace(pinned, num_pinned_blocks=n)
            done.set_result(n)

    def _on_failed(self, req: Request, message: str) -> None:
        """Tells the client of a request the core finished with "error"."""
        self._finish_pin(req)
        output = self._outputs.get(req.request_id)
        if output is not None and not output.finished:
            usage = Usage(req.num_prompt_tokens, req.num_output_tokens, 0, 0)
            output.put(None, "", "error", usage, message)

    def _update_metrics(self) -> None:
        s = self.core.scheduler
        self.metrics.update_from(self.core.kv, s.num_preemptions, len(s.running), len(s.waiting),
                                 s.num_queued_prefill_tokens())


def _log_loop_death(task: asyncio.Task) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the engine step loop died", exc_info=task.exception())
