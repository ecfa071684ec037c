"""Sustained load on a live simulated cluster while faults are injected on a schedule.

    python benchmarks/bench_chaos.py [--duration-s 60] [--fuzz-cases 40]

`kvroute serve --engine sim` (preset tiny, 4 replicas, the gateway path, a local Ray
instance in this process) under 8 clients sending completions (half streamed) for
--duration-s, on loopback. The schedule: kill the busiest engine replica, restart the KV
index actor, kill another replica, and a slow client that opens a stream and never reads
it through all of them. After each fault: how long until every router's index equals the
replicas' true contents, counted from when Serve's replica set is stable again. After the
load: every request completed or failed with a clear error (an OpenAI error body or error
event), none hung past its deadline, none was lost (no answer at all), and once idle the
routers' outstanding load is 0. Then a fuzz run of the gateway's OpenAPI document
(schemathesis): any 5xx counts.

Each request that failed is kept with its error (status, code, message), when it ran, the
replicas killed while it ran (the error names none: the client is told no host, pid or
actor), and how many events it streamed before it, against the faults' times: a stream
that had started and was cut with an error event while a replica was killed is a kill cut
(by design: once tokens reached the client nothing is replayed); anything else is not (a
request not yet streaming when its replica died must be retried elsewhere).

The last line is a JSON object: requests_sent, completed, failed_clearly, hung, lost,
failed_kill_cut, failed_other, failed_quoting_internals (errors that name a pid, IP or
actor), index_diverged_s_max, leaked_outstanding, fuzz_cases, fuzz_5xx, faults, failures.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import sys
import threading
import time
from pathlib import Path

import httpx
import ray

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from router.cli import APP_NAME  # noqa: E402
from router.cluster.index_actor import INDEX_ACTOR_NAME  # noqa: E402
from tests.router.serve.serve_helpers import kvroute_server, wait_until  # noqa: E402
from tests.router.serve.test_serve_failover import _call, _complete, _truth  # noqa: E402

SHARED = "A system prompt the chaos clients share, long enough to span blocks. " * 4
REQUEST_DEADLINE_S = 120.0


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--duration-s", type=float, default=60.0)
    p.add_argument("--clients", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--fuzz-cases", type=int, default=40, help="per API operation")
    return p.parse_args(argv)


# What a client's error must never quote (Ray's actor errors carry all of them).
INTERNALS = re.compile(r"pid[=: ]+\d+|\b\d{1,3}(?:\.\d{1,3}){3}\b|actor|[0-9a-f]{32}|"
                       r"SERVE_REPLICA|EngineReplica#")


def failure(result: dict | None, error: str | None, stream: bool, start_s: float,
            end_s: float) -> dict:
    """A failed request as kept: its status and OpenAI error (or what broke), when it ran
    (seconds from the load's start), and the events it streamed before the error."""
    events = (result or {}).get("events") or []
    body = (result or {}).get("body")
    err: dict = {}
    if events:
        try:
            err = json.loads(events[-1]).get("error") or {}
        except (ValueError, AttributeError):
            err = {}
    elif isinstance(body, dict) and isinstance(body.get("error"), dict):
        err = body["error"]
    message = str(err.get("message") or error or "")
    return {"stream": stream, "status": (result or {}).get("status"), "code": err.get("code"),
            "message": message[:400],
            "events_before_error": max(0, len(events) - 1), "start_s": round(start_s, 2),
            "end_s": round(end_s, 2)}


def killed_during(failed: dict, faults: list[dict]) -> list[str]:
    """The replicas killed while the failed request ran."""
    return [f["replica"] for f in faults if f["fault"] == "kill replica"
            and failed["start_s"] <= f["at_s"] <= failed["end_s"]]


def classify(failed: dict, faults: list[dict]) -> str:
    """"kill cut": a stream that had started, ended by an error event while a replica kill
    fell within the request (by design); "other" for anything else."""
    cut = (failed["stream"] and failed["status"] == 200 and failed["events_before_error"] >= 1
           and failed["code"] == "replica_unavailable")
    return "kill cut" if cut and killed_during(failed, faults) else "other"


def outcome(result: dict) -> str:
    """completed, failed_clearly or unclear (an answer without an OpenAI error)."""
    if result["status"] == 200 and "body" in result:
        return "completed"
    if result["status"] == 200:
        last = result["events"][-1] if result["events"] else ""
        if last == "[DONE]":
            return "completed"
        try:
            error = json.loads(last)["error"]
            return "failed_clearly" if error.get("message") else "unclear"
        except (ValueError, KeyError, TypeError):
            return "unclear"
    body = result.get("body")
    return ("failed_clearly" if isinstance(body, dict) and body.get("error", {}).get("message")
            else "unclear")


class Load:
    """Clients sending until stopped; each request's outcome recorded. Paused while the
    routers' views are compared with the replicas (under load the contents change every
    step, and equality at one instant means nothing)."""

    def __init__(self, server, args):
        self.server, self.args = server, args
        self.stop = threading.Event()
        self.running = threading.Event()
        self.running.set()
        self.in_flight = 0
        self._lock = threading.Lock()
        self.outcomes: list[str] = []
        self.failures: list[dict] = []
        self.start_s = time.monotonic()
        self.pool = concurrent.futures.ThreadPoolExecutor(args.clients)
        self.futures = [self.pool.submit(self._client, c) for c in range(args.clients)]

    def _client(self, c: int) -> None:
        i = 0
        while not self.stop.is_set():
            self.running.wait()
            i += 1
            with self._lock:
                self.in_flight += 1
            stream, start_s = i % 2 == 0, time.monotonic() - self.start_s
            try:
                result = _complete(self.server, SHARED + f"client {c} request {i}",
                                   self.args.max_tokens, stream=stream)
                self.outcomes.append(outcome(result))
                if self.outcomes[-1] != "completed":
                    self.failures.append(failure(result, None, stream, start_s,
                                                 time.monotonic() - self.start_s))
            except httpx.HTTPError as err:
                self.outcomes.append("lost")  # no answer at all: the connection broke
                self.failures.append(failure(None, repr(err), stream, start_s,
                                             time.monotonic() - self.start_s))
            finally:
                with self._lock:
                    self.in_flight -= 1

    def pause(self) -> None:
        self.running.clear()
        wait_until(lambda: self.in_flight == 0, REQUEST_DEADLINE_S, "in-flight requests")

    def resume(self) -> None:
        self.running.set()

    def finish(self) -> int:
        """Stops the clients; returns how many did not end within the deadline (hung)."""
        self.stop.set()
        self.running.set()
        done, pending = concurrent.futures.wait(self.futures, timeout=REQUEST_DEADLINE_S)
        self.pool.shutdown(wait=False, cancel_futures=True)
        return len(pending)


def converge_s(server, index, load: Load, victim: str | None, num_replicas: int) -> float:
    """Seconds from a stable replica set (the load paused) until every router's view equals
    the replicas' contents; the load resumes after."""
    try:
        load.pause()
        return _converge_s(server, index, victim, num_replicas)
    finally:
        load.resume()


def _converge_s(server, index, victim: str | None, num_replicas: int) -> float:
    def stable():
        ids = server.replica_ids()
        return ids if len(ids) == num_replicas and victim not in ids else None

    replica_ids = wait_until(stable, 180, "a stable replica set")
    wait_until(lambda: None not in _truth(replica_ids).values(), 60, "every replica reachable")
    start = time.monotonic()
    deadline = start + 60

    def matches() -> bool:
        truth, views = _truth(replica_ids), _call(index.router_views)
        return bool(views) and all(v == truth for v in views.values())

    while not matches():
        if time.monotonic() > deadline:
            return float("inf")
        time.sleep(0.2)
    return time.monotonic() - start


def busiest(server) -> str:
    def pick():
        running = server.by_label("kvroute_engine_requests", "replica", state="running")
        return max(running, key=running.get) if any(running.values()) else None
    return wait_until(pick, 60, "requests running on some replica")


def kill_replica(replica_id: str) -> None:
    ray.kill(ray.get_actor(f"SERVE_REPLICA::{APP_NAME}#EngineReplica#{replica_id}",
                           namespace="serve"), no_restart=True)


def fuzz(base_url: str, max_cases: int) -> tuple[int, int]:
    """(cases sent, 5xx answers) over every operation of the OpenAPI document."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings

    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    counts = {"cases": 0, "5xx": 0}
    for result in schema.get_all_operations():
        operation = result.ok()

        @given(case=operation.as_strategy())
        @settings(max_examples=max_cases, deadline=None, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case):
            if isinstance(case.body, dict) and case.body.get("stream") is True:
                case.body["stream"] = False
            counts["cases"] += 1
            counts["5xx"] += case.call(base_url=base_url, timeout=60).status_code >= 500

        check()
    return counts["cases"], counts["5xx"]


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    server_args = {"model": "tiny", "replicas": 4, "engine": "sim", "policy": "cache_aware",
                   "num_blocks": 128, "cpus_per_rank": 0.25}
    with kvroute_server(server_args) as server:
        index = ray.get_actor(INDEX_ACTOR_NAME, namespace="kvroute")
        slow = httpx.Client(base_url=server.base_url, timeout=None)
        slow_stream = slow.stream("POST", "/v1/completions", json={
            "model": "tiny", "prompt": "a client that never reads", "max_tokens": 2000,
            "stream": True, "ignore_eos": True})
        slow_stream.__enter__()  # the response is open; nothing reads it
        load = Load(server, args)
        start = load.start_s
        faults: list[dict] = []

        def fault(what: str, replica: str | None = None) -> None:
            at_s = time.monotonic() - start
            faults.append({"fault": what, "replica": replica, "at_s": round(at_s, 2)})
            print(f"{at_s:5.1f}s {what} {replica or ''}", flush=True)

        diverged: dict[str, float] = {}
        period = args.duration_s / 4
        time.sleep(period)  # steady load first
        victim = busiest(server)
        kill_replica(victim)
        fault("kill replica", victim)
        diverged["kill replica"] = converge_s(server, index, load, victim, 4)
        before = _call(index.get_incarnation)
        ray.kill(index, no_restart=False)
        fault("restart index")
        wait_until(lambda: _call(index.get_incarnation) not in (None, before), 60,
                   "Ray to restart the index actor")
        diverged["restart index"] = converge_s(server, index, load, None, 4)
        victim = busiest(server)
        kill_replica(victim)
        fault("kill replica", victim)
        diverged["kill replica again"] = converge_s(server, index, load, victim, 4)
        time.sleep(max(0.0, args.duration_s - (time.monotonic() - start)))
        hung = load.finish()
        slow_stream.__exit__(None, None, None)
        slow.close()

        def outstanding() -> float:
            return sum(server.by_label("kvroute_router_outstanding_requests",
                                       "replica").values())

        try:
            wait_until(lambda: outstanding() == 0, 30, "outstanding load back to zero")
        except AssertionError:
            pass
        leaked = outstanding()
        fuzz_cases, fuzz_5xx = fuzz(server.base_url, args.fuzz_cases)
    counts = {k: load.outcomes.count(k) for k in ("completed", "failed_clearly", "unclear",
                                                  "lost")}
    for fault, seconds in diverged.items():
        print(f"index equal to the replicas {seconds:.2f} s after: {fault}")
    failures = [{**f, "class": classify(f, faults), "killed_during": killed_during(f, faults)}
                for f in load.failures]
    out = {"requests_sent": len(load.outcomes) + hung, "completed": counts["completed"],
           "failed_clearly": counts["failed_clearly"], "unclear": counts["unclear"],
           "hung": hung, "lost": counts["lost"],
           "failed_kill_cut": sum(f["class"] == "kill cut" for f in failures),
           "failed_other": sum(f["class"] == "other" for f in failures),
           "failed_quoting_internals": sum(bool(INTERNALS.search(f["message"]))
                                           for f in failures if f["status"] is not None),
           "index_diverged_s_max": round(max(diverged.values()), 2),
           "leaked_outstanding": leaked, "fuzz_cases": fuzz_cases, "fuzz_5xx": fuzz_5xx,
           "duration_s": args.duration_s, "load_avg_1m": round(os.getloadavg()[0], 2),
           "faults": faults, "failures": failures}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
