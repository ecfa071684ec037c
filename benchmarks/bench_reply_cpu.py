"""What one index poll reply costs the ingress router's event-loop thread, outside Ray.

On the default path each lone request's end comes back to the router that routed it in a
poll reply of its own (router/serve/route_tracking.py -> the index actor -> the router's
long poll), handled on the router's one loop thread, where the next request's decision waits
for it. This runs the real `ServeRequestRouter` (router/serve/request_router.py) and its
`IndexMirror` without Ray or Serve: it routes lone direct requests (a `RouteCall`, random
prompt tokens) through `choose_replicas`, and after each one polls once, over the real fast
call (router/cluster/fast_calls.py; the actor's side in a process of its own), and
gets the reply the live path brings: the chosen replica's one event batch (the request's
blocks stored, as many of its oldest evicted), the request's claim and end, every replica's
stats, packed as the actor sends it. Each replica starts with `--held-blocks` blocks.

Per poll: thread CPU of the loop thread from `IndexMirror._poll`'s call to its return (its
wait is idle), and of its parts: the request made; the loop thread's pickling (the request,
the reply); `_apply`; `routes_finished`; `_reconcile`; the rest (the fast call's sockets and
tasks, the batches' unpacking, the loop's wakes, the mirror's bookkeeping); the router
core's share of `_apply` and `routes_finished` (`Router.apply_batches`, `Router.on_finished`);
and beside it the decision of the request whose end the reply carries. `--reply foreign`: the
replies a second router gets for each of the first's requests instead (two ingress routers,
the default): its pending mark and routed work, then its work's end, each alone, as the
actor relays them (no decision here). `--tree NAME=DIR`
runs each checkout's code (PYTHONPATH=DIR) in a process of its own, the trees in turns,
`--rounds` times; figures pool the rounds.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import pickle
import random
import statistics
import subprocess
import sys
import threading
import time
from collections import deque
from types import SimpleNamespace

# of a poll (`rest`: the fast call's sockets and tasks, the batches' unpacking, the loop's
# wakes, the mirror's bookkeeping)
PARTS = ("request", "pickling", "apply", "routes_finished", "reconcile", "rest")
# within them, the router core's own (router/core/router.py): in `apply`, in `routes_finished`
CORE_PARTS = ("Router.apply_batches", "Router.on_finished")
ROWS = ("total", *PARTS, *CORE_PARTS, "decision")


def _stats(num_blocks: int):
    from protocol.engine import EngineStats
    return EngineStats(num_running=0, num_waiting=0, num_queued_prefill_tokens=0,
                       num_blocks=num_blocks, num_used_blocks=0, num_cached_blocks=num_blocks,
                       num_pinned_blocks=0, num_free_blocks=0, num_host_blocks=0,
                       num_host_cached_blocks=0)


class _Timed:
    """Wraps a callable; adds its thread CPU to `ns[part]` when the calling thread is
    `thread_id` (any thread: None)."""

    def __init__(self, fn, ns: dict, part: str, thread_id: int | None = None):
        self.fn, self.ns, self.part, self.thread_id = fn, ns, part, thread_id

    def __call__(self, *args, **kw):
        if self.thread_id is not None and threading.get_ident() != self.thread_id:
            return self.fn(*args, **kw)
        start = time.thread_time_ns()
        try:
            return self.fn(*args, **kw)
        finally:
            self.ns[self.part] += time.thread_time_ns() - start


class _Actor:
    """The index actor's side: its `poll` answers with the reply its `publish` was given
    last (the bench's way to hand it the next one, over the same socket)."""

    def __init__(self):
        self.reply = None

    def publish(self, reply) -> None:
        self.reply = reply

    async def poll(self, request):
        return self.reply


def _serve_actor(conn) -> None:
    """The actor's process: serves `_Actor` over the fast calls, says where on `conn`."""
    from router.cluster import fast_calls
    try:
        from router.cluster.fast_call_server import FastCallServer
    except ImportError:  # a checkout from before the server had a module of its own
        FastCallServer = fast_calls.FastCallServer

    async def serve() -> None:
        conn.send(FastCallServer(_Actor(), fast_calls.FAST_METHODS, "127.0.0.1").address())
        await asyncio.Event().wait()

    asyncio.run(serve())


class _DirectHandle:
    """`poll.remote` as a future the loop resolves with the reply, pickled as it leaves the
    actor and unpickled on the router's loop (no transport)."""

    def __init__(self, ns: dict):
        self.ns = ns
        self.data = b""  # the reply as it left the actor (`set_reply`)
        self.poll = SimpleNamespace(remote=self._poll)

    async def set_reply(self, reply) -> None:
        self.data = pickle.dumps(reply, protocol=5)

    def _poll(self, request) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_soon(self._reply, future, self.data)
        return future

    def _reply(self, future: asyncio.Future, data: bytes) -> None:
        start = time.thread_time_ns()
        future.set_result(pickle.loads(data))
        self.ns["pickling"] += time.thread_time_ns() - start


class _FastHandle:
    """`poll` as the fast call of router/cluster/fast_calls.py, to `_Actor` in a process of
    its own (as the index actor is); the loop thread's pickling is timed."""

    def __init__(self, ns: dict):
        from router.cluster import fast_calls

        parent, child = multiprocessing.Pipe()
        self.process = multiprocessing.get_context("spawn").Process(
            target=_serve_actor, args=(child,), daemon=True)
        self.process.start()
        address = parent.recv()
        fast_calls.pickle = SimpleNamespace(dumps=_Timed(pickle.dumps, ns, "pickling"),
                                            loads=_Timed(pickle.loads, ns, "pickling"))
        handle = fast_calls.FastHandle(None, fast_calls.FastCallClient(address))
        self.poll, self._publish = handle.poll, handle.publish

    async def set_reply(self, reply) -> None:
        await self._publish.remote(reply)


class _RequestTimer:
    """The handle, timing the loop thread from `started_ns` to the poll's call."""

    def __init__(self, handle, ns: dict):
        self.handle, self.ns, self.started_ns = handle, ns, 0
        self.poll = SimpleNamespace(remote=self._poll)

    def _poll(self, request):
        self.ns["request"] = time.thread_time_ns() - self.started_ns
        return self.handle.poll.remote(request)


async def _measure(args, profile=None) -> dict:
    """`profile`: a cProfile.Profile on while each reply is handled."""
    from ray.serve._private.common import DeploymentID, ReplicaID, RequestMetadata
    from ray.serve._private.request_router.common import PendingRequest

    from kv.events import BlockRemoved, BlockStored, EventBatch, Snapshot
    from kv.hashing import block_hashes, namespace_root
    from router.cluster.index_actor import PollReply
    from router.cluster.packed_batches import PackedBatches
    from router.cluster.route_ends import claim_of, end_of
    from router.core.candidates import RouterRank
    from router.serve.request_router import ServeRequestRouter
    from router.serve.route_calls import RouteCall

    rng = random.Random(args.seed)
    now = [1000.0]
    router = ServeRequestRouter.__new__(ServeRequestRouter)  # Serve's part unused here
    router.initialize_state(model="tiny", router={"policy": "cache_aware",
                                                  "block_size": args.block_size},
                            clock=lambda: now[0], gateway_id="bench-router")
    router._started = router._pushing = True  # no pushes, no actor: the polls are ours
    ns = dict.fromkeys(ROWS, 0)
    mirror = router.mirror
    mirror._apply = _Timed(mirror._apply, ns, "apply")
    mirror._on_routes_ended = _Timed(mirror._on_routes_ended, ns, "routes_finished")
    mirror._on_poll = _Timed(mirror._on_poll, ns, "reconcile")
    for part in CORE_PARTS:
        method = part.split(".")[1]
        setattr(router.router, method, _Timed(getattr(router.router, method), ns, part))
    actor = _FastHandle(ns) if args.transport == "fast" else _DirectHandle(ns)
    index = _RequestTimer(actor, ns)
    deployment = DeploymentID(name="EngineReplica", app_name="kvroute")
    replica_ids = [f"replica-{k}" for k in range(args.replicas)]
    candidates = [SimpleNamespace(replica_id=ReplicaID(r, deployment)) for r in replica_ids]
    stats = {r: _stats(args.held_blocks) for r in replica_ids}
    root = namespace_root("tiny")

    def random_hashes(n: int) -> list:
        return [rng.randbytes(16) for _ in range(n)]

    held = {r: deque(random_hashes(args.held_blocks)) for r in replica_ids}
    next_seq = dict.fromkeys(replica_ids, 0)
    await actor.set_reply(PollReply(
        tuple(Snapshot(r, "epoch", 0, frozenset(held[r])) for r in replica_ids), (), stats, (),
        incarnation="actor", router_rank=RouterRank(0, 1)))
    await mirror._poll(index, 0.0)

    samples: dict[str, list[int]] = {row: [] for row in ROWS}
    for k in range(args.warmup + args.requests):
        now[0] += args.gap_s
        route_id = f"{k:032x}"
        tokens = [rng.randrange(3, 30_000) for _ in range(args.prompt_tokens)]
        hashes = block_hashes(tokens, args.block_size, root)
        if args.reply == "foreign":
            replies = _foreign_replies(args, route_id, rng.choice(replica_ids), hashes, stats)
            for reply in replies:
                await actor.set_reply(reply)
                total_ns = await _timed_poll(mirror, index, ns, profile if k >= args.warmup
                                             else None)
                if k >= args.warmup:
                    _record(samples, ns, total_ns, 0)
            continue
        call = RouteCall(route_id, tokens, hashes, args.max_tokens)
        start = time.thread_time_ns()
        [[chosen], *_] = await router.choose_replicas(
            candidates, PendingRequest([call], {}, RequestMetadata(route_id, route_id)))
        decision_ns = time.thread_time_ns() - start
        replica_id = chosen.replica_id.unique_id
        evicted = tuple(held[replica_id].popleft() for _ in hashes)
        held[replica_id].extend(hashes)
        events = (BlockStored(tuple(hashes), None), BlockRemoved(evicted))
        batch = EventBatch(replica_id, "epoch", next_seq[replica_id], events)
        next_seq[replica_id] += len(events)
        ends = (claim_of(route_id), end_of(route_id, 0, args.max_tokens, time.time()))
        await actor.set_reply(PollReply(
            (), (), stats, (), ended_route_ids=ends, incarnation="actor",
            packed=PackedBatches.pack([batch]), router_rank=RouterRank(0, 1)))
        total_ns = await _timed_poll(mirror, index, ns,
                                     profile if k >= args.warmup else None)
        if k >= args.warmup:
            _record(samples, ns, total_ns, decision_ns)
    assert not router.router.ledger, "every routed request ended"
    assert not len(mirror.remote), "every other router's routed work ended"
    if args.transport == "fast":
        actor.process.kill()  # the actor's process: ours
    return samples


async def _timed_poll(mirror, index, ns: dict, profile) -> int:
    """One poll of the reply set last; its parts' thread CPU into `ns`, the total returned."""
    for part in (*PARTS, *CORE_PARTS):
        ns[part] = 0
    if profile is not None:
        profile.enable()
    index.started_ns = start = time.thread_time_ns()
    await mirror._poll(index, 0.0)
    total_ns = time.thread_time_ns() - start
    if profile is not None:
        profile.disable()
    return total_ns


def _record(samples: dict, ns: dict, total_ns: int, decision_ns: int) -> None:
    ns["rest"] = total_ns - sum(ns[p] for p in PARTS if p != "rest")
    ns["total"], ns["decision"] = total_ns, decision_ns
    for row in ROWS:
        samples[row].append(ns[row])


def _foreign_replies(args, route_id: str, replica_id: str, hashes, stats) -> list:
    """What another router's request brings this one: its mark with the work it charged,
    then that work's end, each in a reply of its own (router/cluster/index_actor.py)."""
    from router.cluster.index_actor import PollReply
    from router.cluster.shared_marks import RoutedWork, SharedMark, WorkEnd
    from router.core.candidates import RouterRank
    tokens = float(args.prompt_tokens)
    work = RoutedWork(route_id, tokens + args.max_tokens, float(args.max_tokens), tokens)
    rank = RouterRank(0, 2)
    return [PollReply((), (), stats, (), incarnation="actor", router_rank=rank,
                      shared_marks=(SharedMark(replica_id, tuple(hashes), work),)),
            PollReply((), (), stats, (), incarnation="actor", router_rank=rank,
                      shared_marks=(WorkEnd(route_id, replica_id, False, args.max_tokens,
                                            any_placement=True),))]


def _profile(args) -> None:
    """cProfile of the replies' handling."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    asyncio.run(_measure(args, profile))
    pstats.Stats(profile).sort_stats("tottime").print_stats(40)


def _percentile(values: list[int], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1] / 1e3


def _table(by_tree: dict[str, dict]) -> list[str]:
    names = list(by_tree)
    head = f"{'us, thread CPU a reply':<24}" + "".join(f"{n + ' p50':>14}{n + ' p90':>14}"
                                                      for n in names)
    lines = [head]
    for part in ROWS:
        row = f"{part:<24}"
        for name in names:
            values = by_tree[name][part]
            row += f"{_percentile(values, 50):>14.1f}{_percentile(values, 90):>14.1f}"
        lines.append(row)
    return lines


def _run_trees(args) -> None:
    by_tree: dict[str, dict] = {}
    for round_index in range(args.rounds):
        for spec in args.tree:
            name, _, tree = spec.partition("=")
            tree = os.path.abspath(tree)
            cmd = [sys.executable, os.path.abspath(__file__), "--json-only",
                   *_shape_args(args)]
            out = subprocess.run(cmd, cwd=tree, env={**os.environ, "PYTHONPATH": tree},
                                 check=True, capture_output=True, text=True).stdout
            samples = json.loads(out.strip().splitlines()[-1])["samples"]
            pooled = by_tree.setdefault(name, {p: [] for p in samples})
            for part, values in samples.items():
                pooled[part].extend(values)
            print(f"round {round_index + 1} {name}: total p50 "
                  f"{_percentile(samples['total'], 50):.1f} us", flush=True)
    print("\n".join(_table(by_tree)))
    print(json.dumps({name: {part: {"p50_us": _percentile(v, 50), "p90_us": _percentile(v, 90)}
                             for part, v in parts.items()} for name, parts in by_tree.items()}))


def _shape_args(args) -> list[str]:
    return [f"--{name.replace('_', '-')}={getattr(args, name)}"
            for name in ("requests", "warmup", "replicas", "held_blocks", "prompt_tokens",
                         "block_size", "max_tokens", "gap_s", "seed", "transport", "reply")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--warmup", type=int, default=200)
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--held-blocks", type=int, default=2000, help="each replica's, at start")
    parser.add_argument("--prompt-tokens", type=int, default=32)
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=1)
    parser.add_argument("--gap-s", type=float, default=0.013,
                        help="the router's clock between requests (its timeouts, decays)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--transport", choices=("fast", "direct"), default="fast",
                        help="the poll over the fast calls' ZMQ socket (the default path's), "
                        "or a future the loop resolves (the mirror's own work only)")
    parser.add_argument("--reply", choices=("own", "foreign"), default="own",
                        help="the routing router's reply (its request's events and end), or "
                        "a second router's two (the first's mark and work, its work's end)")
    parser.add_argument("--tree", action="append", default=[], metavar="NAME=DIR",
                        help="a checkout to run, in turns with the others (repeatable)")
    parser.add_argument("--rounds", type=int, default=3, help="with --tree: turns a tree")
    parser.add_argument("--profile", action="store_true", help="cProfile, this checkout")
    parser.add_argument("--json-only", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.tree:
        _run_trees(args)
    elif args.profile:
        _profile(args)
    else:
        samples = asyncio.run(_measure(args))
        if args.json_only:
            print(json.dumps({"samples": samples}))
        else:
            print("\n".join(_table({"this": samples})))
            print(json.dumps({part: {"p50_us": _percentile(v, 50), "p90_us": _percentile(v, 90)}
                              for part, v in samples.items()}))


if __name__ == "__main__":
    main()
