"""A discrete-event simulation of a kvroute cluster: the real router in front of N simulated
replicas (real scheduler, KV manager, host tier, events), on one virtual clock.

Events, in time order (ties in the order they were scheduled, so a seed fixes the run):

    arrival    the gateway routes the request (Router.route) and the replica queues it
    step done  the replica applies its step; finished requests end (Router.on_finished);
               a finished multi-turn round releases the next one
    publish    every publish_interval_s a replica with news drains its event log and stats
               (worker/vllm_events/publisher.py does the same), which reach the router after
               event_delay_s: Router.apply_batch (a snapshot when it asks), update_stats
    share      with several gateways sharing, what one router shares of a decision (its
               marks; its routed work, then its end) reaches the others after
               share_pending_delay_s (benchmarks/simlib/gateways.py)

In approximate mode the router gets neither events nor stats: that mode stands for "no
index feed at all", so it decides from its routed history and its own load count.
"""

from __future__ import annotations

import heapq
import math
import time
import zlib
from dataclasses import dataclass

import numpy as np

from benchmarks.simlib.gateways import SPREADS, Gateways
from benchmarks.simlib.pooled import PooledLRU
from benchmarks.simlib.prompts import PromptBuilder, TokenSource
from benchmarks.simlib.replica import ReplicaConfig, SimReplica
from benchmarks.simlib.whatifs import WhatIfs
from benchmarks.simlib.workloads import WorkItem, Workload
from kv.hashing import block_hashes, namespace_root
from protocol.engine import SamplingParams
from router.core.candidates import list_offset, rank_among, rotated, router_offset
from router.core.router import RouterConfig
from worker.engine.request import Request

_ARRIVAL, _STEP_DONE, _PUBLISH, _DELIVER, _SHARE = range(5)
MAX_TOKENS_SENT = ("workload_max", "context", "exact")  # ClusterConfig.max_tokens_sent


@dataclass(frozen=True)
class ClusterConfig:
    num_replicas: int
    replica: ReplicaConfig
    router: RouterConfig
    event_delay_s: float = 0.01  # a published batch reaches the router this much later
    publish_interval_s: float = 0.05  # router.serve.publisher.PublisherConfig's default
    model_name: str = "sim-llama3-8b"  # the hash namespace
    seed: int = 0  # token ids of the workload's segments
    # Router what-ifs, measured and left out of the product (benchmarks/simlib/whatifs.py).
    whatifs: WhatIfs = WhatIfs()
    # False: a multi-turn round's history holds other tokens than the answer the engine
    # generated (as when a client sends the answer back as text that does not re-encode to
    # the same ids: the live benches' byte-level sim answers), so the engine's cached
    # answer blocks are never reused and the answer is recomputed as prompt.
    answers_reencode: bool = True
    # Router processes (kvroute serve's gateways), each with its own Router: its own
    # pending marks, load count and (approximate mode) routed history, the same event feed.
    # `router_spread` says which one each request meets (benchmarks/simlib/gateways.py).
    num_routers: int = 1
    router_spread: str = "random"  # as SO_REUSEPORT spreads connections
    # Not None: the pending marks a router sets reach the other routers this much later
    # (through the index actor), where they count as timed marks.
    share_pending_delay_s: float | None = None
    # The routed work too (and when it ends), with the same delay: every router counts it.
    share_work: bool = False
    # Each router lists the replicas from its own offset, by the live routers' rule
    # (router.core.candidates.list_offset): rank i of G, by id, from replica i x N / G on.
    # A policy breaks a full tie (no cache, equal load) by listed order, so routers that
    # know nothing of each other's requests would otherwise all pick the first replica.
    rotate_candidates: bool = False
    # With rotate_candidates: router i's offset is a hash of its id "gateway-i" instead, as
    # a live router's before its first index poll (router_offset): two may share one.
    offset_by_id: bool = False
    # The max_tokens the simulated clients send, the router's only hint of an answer's
    # length (the replica still ends each answer at the workload's length, as the model's
    # EOS would): "workload_max", the workload's longest answer (a client's cap);
    # "context", the context left after the prompt (vLLM's default when a client sends
    # none); "exact", each request's own answer length (an oracle no live router has).
    max_tokens_sent: str = "workload_max"

    def __post_init__(self):
        if not 1 <= self.num_replicas <= 1024:
            raise ValueError(f"num_replicas must be in [1, 1024], got {self.num_replicas}")
        if self.router.block_size != self.replica.block_size:
            raise ValueError(f"router block_size {self.router.block_size} != replica "
                             f"block_size {self.replica.block_size}")
        if not 1 <= self.num_routers <= 64:
            raise ValueError(f"num_routers must be in [1, 64], got {self.num_routers}")
        if self.router_spread not in SPREADS:
            raise ValueError(f"router_spread must be one of {', '.join(SPREADS)}, got "
                             f"{self.router_spread!r}")
        delay_s = self.share_pending_delay_s
        if delay_s is not None and not (math.isfinite(delay_s) and delay_s >= 0):
            raise ValueError(f"share_pending_delay_s must be finite and >= 0, got {delay_s}")
        if self.offset_by_id and not self.rotate_candidates:
            raise ValueError("offset_by_id needs rotate_candidates")
        if self.share_work and delay_s is None:
            raise ValueError("share_work needs share_pending_delay_s (the sharing's delay)")
        if self.max_tokens_sent not in MAX_TOKENS_SENT:
            raise ValueError(f"max_tokens_sent must be one of {', '.join(MAX_TOKENS_SENT)}, "
                             f"got {self.max_tokens_sent!r}")
        if not (math.isfinite(self.event_delay_s) and self.event_delay_s >= 0):
            raise ValueError(f"event_delay_s must be finite and >= 0, got {self.event_delay_s}")
        if not (math.isfinite(self.publish_interval_s) and self.publish_interval_s > 0):
            raise ValueError(f"publish_interval_s must be finite and > 0, got "
                             f"{self.publish_interval_s}")


@dataclass
class RequestRecord:
    request_id: str
    replica_id: str | None  # None: rejected before routing
    arrival_s: float
    num_prompt_tokens: int
    max_tokens: int  # what the client sent (ClusterConfig.max_tokens_sent)
    predicted_hit_tokens: int = 0  # what the router expected (device + host)
    first_token_s: float | None = None
    finish_s: float | None = None
    num_output_tokens: int = 0
    cached_device_tokens: int = 0
    cached_host_tokens: int = 0
    finish_reason: str | None = None
    num_preemptions: int = 0


@dataclass
class RunResult:
    config: ClusterConfig
    workload: str
    records: list[RequestRecord]  # in routing order
    replicas: list[SimReplica]
    pooled: PooledLRU
    sim_duration_s: float
    wall_s: float
    num_events: int
    num_snapshots: int
    num_shared_routes: int = 0  # decisions one router shared with the others
    num_shared_blocks: int = 0  # block hashes in them
    num_marked_blocks: int = 0  # of them, marked by a receiver (past its confirmed run)


class ClusterSim:
    def __init__(self, config: ClusterConfig, workload: Workload):
        self.config = config
        self.workload = workload
        self.now = 0.0
        rc = config.replica
        self.replicas = [SimReplica(f"r{i}", rc) for i in range(config.num_replicas)]
        self.replica_ids = [r.replica_id for r in self.replicas]
        self._index_of = {rid: i for i, rid in enumerate(self.replica_ids)}
        sharing = config.share_pending_delay_s is not None
        self.gateways = Gateways(config.router, config.num_routers, config.router_spread,
                                 config.seed, clock=lambda: self.now, share_marks=sharing,
                                 share_work=config.share_work, whatifs=config.whatifs)
        self.routers = self.gateways.routers
        self.router_ids = [f"gateway-{i}" for i in range(config.num_routers)]
        self.router = self.routers[0]
        self.feed_index = not config.router.approximate
        self.root = namespace_root(config.model_name)
        source = TokenSource(config.seed, 3, rc.vocab_size, workload.shared_keys())
        self.prompts = PromptBuilder(source, rc.block_size, self.root)
        self.pooled = PooledLRU(config.num_replicas * (rc.num_blocks + rc.num_host_blocks),
                                rc.block_size)
        self.records: dict[str, RequestRecord] = {}
        self._children = {it.parent_id: it for it in workload.items if it.parent_id}
        self._histories: dict[str, tuple[list[int], list[bytes]]] = {}
        self._heap: list[tuple] = []
        self._seq = 0
        self._max_output_tokens = max((it.max_tokens for it in workload.items), default=1)
        self._publish_due = [False] * config.num_replicas
        self.num_events = 0
        self.num_snapshots = 0

    def _candidates(self, gateway: int) -> list[str]:
        """The live replicas as router `gateway` lists them: from its own offset with
        rotate_candidates (taken over the replicas alive now: a dead one is never listed)."""
        if not self.config.rotate_candidates:
            return self.replica_ids
        router_id = self.router_ids[gateway]
        rank = None if self.config.offset_by_id else rank_among(router_id, self.router_ids)
        offset = list_offset(len(self.replica_ids), router_offset(router_id), rank)
        return rotated(self.replica_ids, offset)

    def _push(self, t: float, kind: int, arg) -> None:
        self._seq += 1
        heapq.heappush(self._heap, (t, self._seq, kind, arg))

    def run(self) -> RunResult:
        wall0 = time.perf_counter()
        if self.feed_index:
            for rep in self.replicas:
                for router in self.routers:
                    router.apply_snapshot(rep.core.snapshot())
        for item in self.workload.items:
            if item.parent_id is None:
                self._push(item.arrival_s, _ARRIVAL, item)
        heap, pop = self._heap, heapq.heappop
        handlers = (self._on_arrival, self._on_step_done, self._on_publish, self._on_deliver,
                    self.gateways.apply)
        while heap:
            t, _, kind, arg = pop(heap)
            self.now = t
            self.num_events += 1
            handlers[kind](arg)
        assert len(self.records) == self.workload.num_requests, "a request never arrived"
        return RunResult(self.config, self.workload.name, list(self.records.values()),
                         self.replicas, self.pooled, self.now, time.perf_counter() - wall0,
                         self.num_events, self.num_snapshots, self.gateways.num_shared_routes,
                         self.gateways.num_shared_blocks, self.gateways.num_marked_blocks)

    # -- requests --------------------------------------------------------------------------

    def _on_arrival(self, item: WorkItem) -> None:
        history = self._histories.pop(item.parent_id, ([], [])) if item.parent_id else ([], [])
        token_ids, hashes = self.prompts.build(item.segments, *history)
        n = len(token_ids)
        max_model_len = self.config.replica.max_model_len
        sent = self.config.max_tokens_sent
        max_tokens = (item.max_tokens if sent == "exact" else self._max_output_tokens
                      if sent == "workload_max" else max(1, max_model_len - n))
        rec = RequestRecord(item.request_id, None, self.now, n, max_tokens)
        self.records[item.request_id] = rec
        if n >= max_model_len:  # the engine would reject it
            self._end(rec, "rejected", token_ids, hashes)
            return
        gateway = self.gateways.pick(item)
        decision = self.routers[gateway].route(item.request_id, hashes, n,
                                               self._candidates(gateway), max_tokens)
        shared = self.gateways.shared_route(item.request_id, decision, hashes, max_tokens)
        if shared is not None:
            self._push(self.now + self.config.share_pending_delay_s, _SHARE, shared)
        rec.replica_id = decision.replica_id
        rec.predicted_hit_tokens = (decision.predicted_device_hit_tokens
                                    + decision.predicted_host_hit_tokens)
        self.pooled.serve_prompt(hashes, n)
        i = self._index_of[decision.replica_id]
        rep = self.replicas[i]
        # the answer ends at the workload's length (a live model's EOS), whatever was sent
        rep.add(Request(item.request_id, token_ids, SamplingParams(max_tokens=item.max_tokens),
                        rep.config.block_size, self.root, hashes, arrival_time=self.now))
        if not rep.is_busy:
            self._start_step(i)
        self._mark_dirty(i)

    def _start_step(self, i: int) -> None:
        rep = self.replicas[i]
        duration_s = rep.start_step()
        for req in rep.failed:
            self._finish(req)
        rep.failed.clear()
        if duration_s is not None:
            self._push(self.now + duration_s, _STEP_DONE, i)

    def _on_step_done(self, i: int) -> None:
        rep = self.replicas[i]
        for req in rep.finish_step():
            rec = self.records[req.request_id]
            if rec.first_token_s is None:
                rec.first_token_s = self.now
                if self.config.whatifs.first_token_signal:
                    self.gateways.router_of(req.request_id).on_first_token(req.request_id)
                    self._share_end(req.request_id, first_token=True)
            if req.is_finished:
                self._finish(req)
        self._start_step(i)
        self._mark_dirty(i)

    def _finish(self, req: Request) -> None:
        rec = self.records[req.request_id]
        rec.num_output_tokens = req.num_output_tokens
        rec.cached_device_tokens = req.num_cached_device_tokens
        rec.cached_host_tokens = req.num_cached_host_tokens
        rec.num_preemptions = req.num_preemptions
        self.gateways.router_of(req.request_id).on_finished(
            req.request_id, output_tokens=req.num_output_tokens)
        self._share_end(req.request_id, first_token=False, output_tokens=req.num_output_tokens)
        self.pooled.release(req.block_hashes)
        self._end(rec, req.finish_reason or "error", req.token_ids, req.block_hashes)

    def _share_end(self, request_id: str, first_token: bool,
                   output_tokens: int | None = None) -> None:
        shared = self.gateways.shared_end(request_id, first_token, output_tokens)
        if shared is not None:
            self._push(self.now + self.config.share_pending_delay_s, _SHARE, shared)

    def _end(self, rec: RequestRecord, reason: str, token_ids: list[int],
             hashes: list[bytes]) -> None:
        assert rec.finish_s is None, f"{rec.request_id} finished twice"
        rec.finish_s = self.now
        rec.finish_reason = reason
        child = self._children.pop(rec.request_id, None)
        if child is not None:
            if not self.config.answers_reencode:
                token_ids, hashes = self._other_answer(rec, token_ids, hashes)
            self._histories[rec.request_id] = (token_ids, hashes)
            self._push(max(child.arrival_s, self.now + child.think_s), _ARRIVAL, child)

    def _other_answer(self, rec: RequestRecord, token_ids: list[int], hashes: list[bytes]
                      ) -> tuple[list[int], list[bytes]]:
        """The history with the answer's tokens replaced by others of the same length."""
        n, B = rec.num_prompt_tokens, self.config.replica.block_size
        seed = zlib.crc32(rec.request_id.encode())
        other = np.random.default_rng([self.config.seed, seed]).integers(
            3, self.config.replica.vocab_size, len(token_ids) - n).tolist()
        ids = list(token_ids[:n]) + other
        start = n // B
        return ids, list(hashes[:start]) + block_hashes(ids, B, self.root, start,
                                                        hashes[start - 1] if start else None)

    # -- the index feed --------------------------------------------------------------------

    def _mark_dirty(self, i: int) -> None:
        """Schedules replica i's next publish tick, strictly after now (replica i ticks at
        phase i / N of the interval, so the replicas do not all publish at once)."""
        if self._publish_due[i]:
            return
        self._publish_due[i] = True
        interval = self.config.publish_interval_s
        phase = interval * i / len(self.replicas)
        tick = phase + interval * (math.floor((self.now - phase) / interval) + 1)
        if tick <= self.now:  # rounding put it on now
            tick += interval
        self._push(tick, _PUBLISH, i)

    def _on_publish(self, i: int) -> None:
        self._publish_due[i] = False
        rep = self.replicas[i]
        batch = rep.core.drain_events()
        if self.feed_index:
            self._push(self.now + self.config.event_delay_s, _DELIVER, (i, batch, rep.core.stats()))
        if rep.is_busy or rep.core.has_work:
            self._mark_dirty(i)

    def _on_deliver(self, arg) -> None:
        i, batch, stats = arg
        rep = self.replicas[i]
        for router in self.routers:
            if router.apply_batch(batch):
                router.apply_snapshot(rep.core.snapshot())
                self.num_snapshots += 1
            router.update_stats(rep.replica_id, stats)
