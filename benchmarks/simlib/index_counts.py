"""Counts of the calls the KV index actor takes and the long polls it wakes, for benchmarks.

The end path of a direct request costs CPU in four processes (replica, index actor, the
router that routed it, the other routers), one Ray call or one woken poll at a time; these
counts say what the CPU is spent on. They still follow the box's speed (how many ends a
call batches depends on the request rate and the round trips), so two versions of the path
compare over alternating rounds at like loads, not in one pair. `IndexCounter` starts a
Ray driver (a child process, outside the CPU a benchmark measures) that creates the
cluster's named index actor before `kvroute serve` does (the product finds it by name and
uses it): the checkout's own
`KVIndex`, each public method wrapped to count its calls, and what the calls carried:
  calls.<method>        calls the actor took (each one wakes it; `calls`: all of them)
  publishes_with_ends   publishes that carried route reports
  report_calls          report_routes calls (a replica's claims and ends, sent soon)
  ends_reported         ends and refusals those carried (claims not counted)
  share_calls_ends_only share_marks calls with nothing but work ends
  work_ends_shared      work ends all share_marks calls carried
  poll_replies_ends_only / _other_news / _empty   each mirror poll by what its reply held
  polls_woken           waiting long polls a call woke (a woken poll re-checks, then returns
                        or waits again)
Works on older checkouts too (it only needs `KVIndex` and its method names), so a tree
before a change and after it are counted by the same code.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

from benchmarks.simlib.servers import PYTHON, SLOW_BOX_ENV

_DRIVER = r'''
import collections, functools, inspect, json, sys
import ray
from router.cluster.actors import get_or_create_actor
from router.cluster.index_actor import INDEX_ACTOR_NAME, IndexActorConfig, KVIndex


def _num_ends(reports):
    return sum(1 for ids in (reports or {}).values() for r in ids if not r.startswith("+"))


class CountedKVIndex(KVIndex):
    def __init__(self, *args):
        super().__init__(*args)
        self.counts = collections.Counter()

    def publish(self, batch, stats=None, ended_routes=None):
        self.counts["calls.publish"] += 1
        if ended_routes:
            self.counts["publishes_with_ends"] += 1
            self.counts["ends_published"] += _num_ends(ended_routes)
        return super().publish(batch, stats, ended_routes)

    def report_routes(self, reports, *args):
        self.counts["calls.report_routes"] += 1
        self.counts["report_calls"] += 1
        self.counts["ends_reported"] += _num_ends(reports)
        return super().report_routes(reports, *args)

    def share_marks(self, router_id, marks):
        self.counts["calls.share_marks"] += 1
        ends = sum(1 for m in marks if type(m).__name__ == "WorkEnd")
        self.counts["work_ends_shared"] += ends
        if ends == len(marks):
            self.counts["share_calls_ends_only"] += 1
        return super().share_marks(router_id, marks)

    async def poll(self, request):
        self.counts["calls.poll"] += 1
        reply = await super().poll(request)
        other = (reply.snapshots or reply.batches or reply.packed
                 or reply.removed_replica_ids or reply.shared_marks)
        kind = "other_news" if other else "ends_only" if reply.ended_route_ids else "empty"
        self.counts["poll_replies_" + kind] += 1
        return reply

    def _notify(self, *args, **kwargs):
        waiting = len(self._waiters)
        super()._notify(*args, **kwargs)
        self.counts["polls_woken"] += waiting - len(self._waiters)

    def call_counts(self):
        return dict(self.counts)


def _counted(name, method):
    @functools.wraps(method)
    def call(self, *args, **kwargs):
        self.counts["calls." + name] += 1
        return method(self, *args, **kwargs)
    return call


for _name, _method in inspect.getmembers(KVIndex, inspect.isfunction):
    if (not _name.startswith("_") and _name not in CountedKVIndex.__dict__
            and not inspect.iscoroutinefunction(_method)):
        setattr(CountedKVIndex, _name, _counted(_name, _method))

ray.init(address=sys.argv[1], namespace="kvroute", log_to_driver=False)
actor_cls = ray.remote(num_cpus=0, max_restarts=-1, max_task_retries=0,
                       max_concurrency=1000)(CountedKVIndex)
for line in sys.stdin:
    actor = get_or_create_actor(actor_cls, INDEX_ACTOR_NAME, IndexActorConfig())
    try:
        counts = ray.get(actor.call_counts.remote(), timeout=60)
    except (AttributeError, ray.exceptions.RayError) as err:  # not ours (or gone)
        counts = {"error": repr(err)}
    print(json.dumps(counts), flush=True)
'''


class IndexCounter:
    """The named index actor, counted; `read()` creates it if there is none (call it before
    the server starts, and again after anything that killed it) and returns its counts."""

    def __init__(self, address: str, tree: Path | None = None):
        env = {**os.environ, **SLOW_BOX_ENV}  # the instance's auth mode among them
        if tree is not None:
            env["PYTHONPATH"] = str(tree)
        self._proc = subprocess.Popen([PYTHON, "-c", _DRIVER, address], cwd=tree,
                                      env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      text=True)

    def read(self) -> dict[str, int]:
        self._proc.stdin.write("read\n")
        self._proc.stdin.flush()
        line = self._proc.stdout.readline()
        if not line:
            raise RuntimeError("the index counter's driver exited")
        counts = json.loads(line)
        if "error" in counts:
            raise RuntimeError(f"the index actor is not the counted one: {counts['error']}")
        return counts

    def close(self) -> None:
        self._proc.stdin.close()
        self._proc.wait(timeout=60)


def per_request(before: dict[str, int], after: dict[str, int], num_requests: int
                ) -> dict[str, float]:
    """Each count's growth between two reads, per request (3 decimals); `calls`: all the
    calls the actor took."""
    grown = {key: after.get(key, 0) - before.get(key, 0) for key in set(after) | set(before)}
    grown["calls"] = sum(n for key, n in grown.items() if key.startswith("calls."))
    return {key: round(n / num_requests, 3) for key, n in sorted(grown.items()) if n}
