"""One front under a hostile tenant: the victim's baseline alone, then every attack while
the victim streams, then how long the router's state takes to come back.

Measured about the victim and the router, not about the hostile tenant's status codes:
the victim's failures, its TTFT p50 under attack over its own baseline, its requests that
missed its cached prefix; non-finite load values seen in the router's series; seconds until
the router's outstanding requests and load are back to their idle values; engine steps
that failed. Each attack's window is kept, so a victim request that failed or was slow is
laid at the attacks that overlapped it.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, defaultdict
from dataclasses import dataclass

import numpy as np

from benchmarks.hostile.attacks import Attack
from benchmarks.hostile.fronts import Front, nonfinite
from benchmarks.hostile.fuzz import fuzz_cases, fuzz_front
from benchmarks.hostile.phases import lying_worker, quota_race
from benchmarks.hostile.victim import PREFIX_CACHED_TOKENS, Victim

SLOW_OVER_BASELINE = 2.0  # a victim TTFT this many times its baseline p50 is "slow"
# The recent-work part of a replica's load halves every 30 s by design (router/core/config.py
# recent_work_half_life_s): the load is back when nothing is outstanding and what is left
# decays at least that fast from the attack's end.
RECENT_HALF_LIFE_S = 30.0
# The routers push their series to the metrics hub every second and the hub serves a
# process's last push for up to 3 s: a load read now may be that old.
SERIES_AGE_S = 3.0


@dataclass(frozen=True)
class HostileConfig:
    baseline_s: float = 8.0
    # With a router in front, the victim's baseline lasts until its stream has spread to a
    # second replica (its prefix computed there too), up to this long: a lone stream moves
    # once on its own load (the recent work it leaves), which is no attack's doing.
    spread_timeout_s: float = 60.0
    fuzz_cases: int = 1000  # on this front
    settle_timeout_s: float = 60.0
    attacks: tuple[Attack, ...] = ()  # the single hostile requests, sent in turn
    multi_request: bool = True  # the quota race (direct) and the lying worker (workers)

    def __post_init__(self):
        if (self.baseline_s <= 0 or self.fuzz_cases < 0 or self.settle_timeout_s <= 0
                or self.spread_timeout_s < 0):
            raise ValueError(f"HostileConfig: bad values {self}")


class LoadWatch:
    """Polls the router's load series in a thread: non-finite values seen, the peak."""

    def __init__(self, front: Front, interval_s: float = 0.5):
        self.front, self.interval_s = front, interval_s
        self.nonfinite = 0
        self.peak_tokens = 0.0
        self.label = ""  # what runs now: the peak per label shows which attack raised it
        self.peak_by_label: dict[str, float] = {}
        self.known: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def sample(self) -> dict[tuple[str, str], float]:
        """Every series seen so far at its latest value: one missing from a scrape (the
        hub drops a process that has not pushed for 3 s, as a crowded box delays it) keeps
        the value it had, not none (its settling would be judged from no reference)."""
        try:
            loads = self.front.loads()
        except Exception:  # a scrape that failed is not a load value
            return dict(self.known)
        self.known.update(loads)
        loads = dict(self.known)
        self.nonfinite += nonfinite(loads)
        finite = [v for v in loads.values() if v == v and abs(v) != float("inf")]
        self.peak_tokens = max([self.peak_tokens, *finite])
        if self.label:
            self.peak_by_label[self.label] = max([self.peak_by_label.get(self.label, 0.0),
                                                  *finite])
        return loads

    def __enter__(self) -> LoadWatch:
        if self.front.routed:
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()


def _settle_s(front: Front, watch: LoadWatch, idle: dict, timeout_s: float
              ) -> tuple[float | None, dict]:
    """Seconds from the attack's end until no request is outstanding and every replica's
    load is finite and at most its idle value plus its load when the last request ended,
    decayed since by the recent-work half-life, with 10% and the series' age to spare (a
    load that stays up is a leak), with the requests the replicas still count then
    (`_requests_beside`); None past the timeout, with what was left then: the outstanding
    requests and the loads above their bound, by router process and replica, and the same
    counts.

    The reference is the load once nothing is outstanding, not at the attack's end: a
    request ending after that corrects its replica's recent work to the work it did
    (router/core/load.py), which may add to it; once none is outstanding, nothing does."""
    start = time.monotonic()
    at_end = watch.sample()
    quiet: tuple[float, dict] | None = None  # (when, the loads then): nothing outstanding
    left: dict = {}
    while time.monotonic() - start < timeout_s:
        outstanding = front.outstanding_by_router()  # read first: the loads are as recent
        loads = watch.sample()
        if quiet is None and not any(outstanding.values()):
            quiet = (time.monotonic(), loads)
        above: dict = {}
        if quiet is not None:
            # a series read through the hub was computed up to SERIES_AGE_S before the read
            decay = 0.5 ** (max(0.0, time.monotonic() - quiet[0] - SERIES_AGE_S)
                            / RECENT_HALF_LIFE_S)
            bound = {k: idle.get(k, 0.0) + 1.1 * decay * quiet[1].get(k, 0.0) + 1.0
                     for k in loads}
            above = {k: v for k, v in loads.items() if not v <= bound[k]}
            if not any(outstanding.values()) and loads and not above:
                # what the replicas still count then: with nothing outstanding, a running
                # request is one its routers saw end (or stats read late)
                return round(time.monotonic() - start, 2), _requests_beside(
                    front, {replica for _, replica in loads})
        left = {"outstanding": {"/".join(k): v for k, v in outstanding.items() if v},
                "load_above_bound": {"/".join(k): round(v, 1) for k, v in above.items()},
                "their_idle_end_and_quiet": {
                    "/".join(k): (round(idle.get(k, 0.0), 1), round(at_end.get(k, 0.0), 1),
                                  round(quiet[1].get(k, 0.0), 1) if quiet else None)
                    for k in above},
                **(_requests_beside(front, {replica for _, replica in above}) if above
                   else {})}
        time.sleep(0.25)  # polling a series that converges asynchronously
    return None, left


def _await_spread(victim: Victim, timeout_s: float) -> float | None:
    """Seconds waited past the baseline until one of the victim's baseline requests was
    served off its cache (its stream spread to another replica); None past the timeout."""
    start = time.monotonic()
    while time.monotonic() - start < timeout_s:
        if victim.summary("baseline")["off_cache"]:
            return round(time.monotonic() - start, 2)
        time.sleep(0.25)  # polling the victim's thread, which runs on its own
    return None


def _requests_beside(front: Front, replicas: set[str]) -> dict:
    """For replicas whose load stays up: the (running, waiting) requests each router last
    read in the replica's published stats, and the engine's own counts (its gauges, set
    at each step): a replica still running a request its routers saw end, or stats read
    late."""
    published: dict[str, dict[str, float]] = {}
    engine: dict[str, dict[str, float]] = {}
    for n, ls, v in front.samples():
        replica = ls.get("replica", "")
        if replica not in replicas:
            continue
        if n == "kvroute_router_replica_requests":
            published.setdefault(f"{ls.get('gateway', '')}/{replica}", {})[ls["state"]] = v
        elif n == "kvroute_engine_requests":
            engine.setdefault(replica, {})[ls.get("state", "")] = v
    return {"published_requests": published, "engine_requests": engine}


def run_front(front: Front, config: HostileConfig) -> dict:
    cases = fuzz_cases(config.fuzz_cases) if config.fuzz_cases else []  # before any timing
    victim = Victim(front.base_url, front.victim_headers)
    victim.results.append(victim.request())  # computes the shared prefix once
    steps_before, errors_before = front.step_failures(), front.engine_errors()
    tracebacks_before = front.tracebacks()
    victim.phase = "baseline"
    victim.start()
    time.sleep(config.baseline_s)  # the victim alone, for its baseline
    spread_s = _await_spread(victim, config.spread_timeout_s) if front.routed else None
    victim.stop()
    idle = front.loads() if front.routed else {}
    misses_before = front.miss_tokens() if front.routed else {}
    windows: list[tuple[float, float, str]] = []
    outcomes: dict[str, Counter] = defaultdict(Counter)
    detail: dict = {}
    with LoadWatch(front) as watch:
        victim.phase = "attack"
        victim.start()
        attack_start = time.monotonic()
        for attack in config.attacks:
            watch.label = attack.family
            t0 = time.monotonic()
            outcomes[attack.family][attack.send(front)] += 1
            windows.append((t0, time.monotonic(), f"{attack.family}: {attack.name}"))
        if config.multi_request and front.name == "direct":
            t0, watch.label = time.monotonic(), "quota"
            detail["quota_race"] = quota_race(front)
            windows.append((t0, time.monotonic(), "quota: concurrent pin registers"))
        if config.multi_request and front.name == "workers":
            t0, watch.label = time.monotonic(), "liar"
            detail["lying_worker"] = lying_worker(front)
            windows.append((t0, time.monotonic(), "liar: lying worker, huge KV batches"))
        attacks_s = time.monotonic() - attack_start
        t0, watch.label = time.monotonic(), "fuzz"
        fuzz_sent: list[tuple[float, float, str]] = []
        fuzz = (fuzz_front(front, cases, sent=fuzz_sent) if cases
                else {"cases": 0, "5xx": 0})
        windows.append((t0, time.monotonic(), "fuzz: schemathesis"))
        fuzz_s = time.monotonic() - t0
        victim.stop()
        misses = front.miss_tokens() if front.routed else {}
        watch.label = "settle"
        leaked, left = (_settle_s(front, watch, idle, config.settle_timeout_s)
                        if front.routed else (None, {}))
    victim.phase = "after"
    victim.results.append(victim.request())
    base, attack = victim.summary("baseline"), victim.summary("attack")
    ratio = (attack["ttft_p50_s"] / base["ttft_p50_s"]
             if attack["ttft_p50_s"] and base["ttft_p50_s"] else None)
    return {
        "front": front.name, "victim_baseline": base, "victim_attack": attack,
        "victim_after": victim.summary("after"), "victim_spread_after_baseline_s": spread_s,
        "victim_failed": attack["failed"] + victim.summary("after")["failed"],
        "victim_off_cache": attack["off_cache"] + victim.summary("after")["off_cache"],
        "victim_ttft_p50_over_baseline": round(ratio, 3) if ratio else None,
        "load_nonfinite": watch.nonfinite, "load_peak_tokens": round(watch.peak_tokens, 1),
        "load_peak_tokens_by_phase": {k: round(v) for k, v in watch.peak_by_label.items()},
        "load_leaked_after_s": leaked, "load_left_unsettled": left,
        "engine_step_failures": front.step_failures() - steps_before,
        "engine_error_finishes": front.engine_errors() - errors_before,
        "logged_tracebacks": front.tracebacks() - tracebacks_before, "routed": front.routed,
        "attack_outcomes": {f: dict(c) for f, c in outcomes.items()},
        "victim_ttft_p50_s_by_family": ttft_p50_by_family(victim, windows),
        "hurt_by": blame(victim, windows, base["ttft_p50_s"]),
        "off_cache_beside": off_cache_beside(victim, fuzz_sent),
        # under attack, why prompt tokens missed: the hostile prompts are new ("cold"), so
        # "placement" (held elsewhere) and "race" (gone from where it was held) are the
        # victim's: a routing choice, or its blocks evicted under it
        "miss_tokens_under_attack": {c: round(v - misses_before.get(c, 0.0))
                                     for c, v in misses.items()},
        "fuzz": fuzz, "attacks_s": round(attacks_s, 1), "fuzz_s": round(fuzz_s, 1), **detail}


def off_cache_beside(victim: Victim, sent: list[tuple[float, float, str]]
                     ) -> list[list[str]]:
    """For each victim request served off its cache, its cached tokens and the fuzz cases
    in flight beside it."""
    return [[f"cached {r.cached_tokens} of {PREFIX_CACHED_TOKENS}"]
            + [what for t0, t1, what in sent if t0 < r.end_s and r.start_s < t1]
            for r in victim.of("attack")
            if r.ok and (r.cached_tokens or 0) < PREFIX_CACHED_TOKENS]


def ttft_p50_by_family(victim: Victim, windows: list[tuple[float, float, str]]
                       ) -> dict[str, dict]:
    """The victim's served attack-phase requests grouped by the family whose span (its first
    request's start to its last one's end) holds the request's start: how many, and their
    TTFT p50 in ms. The families run one after the other, so each victim request falls in
    at most one."""
    spans: dict[str, list[float]] = {}
    for t0, t1, name in windows:
        family = name.split(":", 1)[0]
        span = spans.setdefault(family, [t0, t1])
        span[0], span[1] = min(span[0], t0), max(span[1], t1)
    out = {}
    for family, (t0, t1) in spans.items():
        ttfts = [r.ttft_s for r in victim.of("attack")
                 if r.ok and r.ttft_s is not None and t0 <= r.start_s < t1]
        out[family] = {"requests": len(ttfts), "ttft_p50_ms": (
            round(1e3 * float(np.median(ttfts)), 2) if ttfts else None)}
    return out


def blame(victim: Victim, windows: list[tuple[float, float, str]],
          baseline_p50_s: float | None) -> dict[str, int]:
    """Attacks overlapping a victim request that failed, was served off its cache or was
    slow, with how many such requests each overlapped."""
    hurt: Counter[str] = Counter()
    for r in victim.of("attack"):
        slow = (baseline_p50_s is not None and r.ttft_s is not None
                and r.ttft_s > SLOW_OVER_BASELINE * baseline_p50_s)
        off_cache = r.ok and (r.cached_tokens or 0) < PREFIX_CACHED_TOKENS
        if r.ok and not slow and not off_cache:
            continue
        what = "failed" if not r.ok else "off cache" if off_cache else "slow"
        for t0, t1, name in windows:
            if t0 < r.end_s and r.start_s < t1:
                hurt[f"{what} <- {name}"] += 1
    return dict(hurt.most_common(12))
