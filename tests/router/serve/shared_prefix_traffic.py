"""Shared-prefix traffic for the several-routers test (test_serve_direct.py), bench_e2e's
shape at a small size: groups of prompts share a system prompt; the groups run side by
side, in steps: each step sends every group's next prompt, once the previous step answered.

HAProxy spreads the routing calls over the ingress routers, so with several the prompt after
a group's first usually reaches a router that did not route the first, before the
replica's KV events reach it: it follows the prefix through the pending marks the other
router shared (router/cluster/shared_marks.py). One router or several, each group's first
prompt misses and every later one finds the group's whole system prompt cached.

That holds once the marks have arrived, and sharing takes a hop through the index actor: on
the 2-core test box at load 7, 10 ms at the median and 20-29 ms at p90 from a decision to
its mark applied at the other router, while a whole request of this shape takes 12-20 ms
(p1-p10) from one decision to the next. So before each step every router has applied every
decision the others shared (`kvroute_router_shared_decisions_total`, the event the claim
rests on), not a sleep: a request faster than the hop would prefill the prefix again, a
race the routers cannot close without a call on the decision path.
"""

from __future__ import annotations

import concurrent.futures
from collections import Counter
from functools import partial
from typing import NamedTuple

import httpx

from router.serve.route_tracking import ROUTED_BY_HEADER
from tests.router.serve.serve_helpers import Server, wait_until

BLOCK_SIZE = 16
NUM_GROUPS, PROMPTS_PER_GROUP = 4, 4
# the tiny model's tokenizer is bytes plus BOS: 511 + 1 tokens, 32 whole blocks
SYSTEM_TOKENS = 32 * BLOCK_SIZE


class Answer(NamedTuple):
    prompt_tokens: int
    cached_tokens: int
    router_id: str | None  # the ingress router that routed it (None: none did)


def system_prompt(group: int) -> str:
    """Group `group`'s (0-99) system prompt, SYSTEM_TOKENS tokens with the BOS."""
    # the group first: the first block (BOS and 15 bytes) already differs between groups
    text = f"{group:02d} shared-prefix group: " + "You answer in one short sentence. " * 16
    return text[:SYSTEM_TOKENS - 1]


def wait_routed(base_url: str, headers: dict[str, str], num_probes: int = 4) -> None:
    """Until `num_probes` completions in a row come back routed by an ingress router (while
    HAProxy takes the routers into its config, a request can pass unrouted)."""
    def routed() -> bool:
        with httpx.Client(base_url=base_url, timeout=30, headers=headers) as http:
            return all(ROUTED_BY_HEADER in http.post("/v1/completions", json={
                "model": "tiny", "prompt": f"probe {i}", "max_tokens": 1}).headers
                       for i in range(num_probes))
    wait_until(routed, 120, "every probe to be routed by an ingress router", 0.5)


def send_prompt(base_url: str, headers: dict[str, str], group: int, i: int) -> Answer:
    """Group `group`'s prompt `i`, answered."""
    with httpx.Client(base_url=base_url, timeout=60, headers=headers) as http:
        resp = http.post("/v1/completions", json={
            "model": "tiny", "prompt": system_prompt(group) + f" Question {i}?",
            "max_tokens": 2, "temperature": 0})
    assert resp.status_code == 200, resp.text
    usage = resp.json()["usage"]
    return Answer(usage["prompt_tokens"], usage["prompt_tokens_details"]["cached_tokens"],
                  resp.headers.get(ROUTED_BY_HEADER))


def shared_decisions(server: Server) -> dict[str, tuple[float, float, float]]:
    """Per router (gateway) that has routed a prompt: (decisions it shared, the others' it
    applied, refreshes of its series). Serve's proxy holds a router too, which serves GETs
    and pushes its series but never routes, so it applies nothing."""
    name = "kvroute_router_shared_decisions_total"
    sent = server.by_label(name, "gateway", direction="sent")
    received = server.by_label(name, "gateway", direction="received")
    refreshes = server.by_label("kvroute_router_series_refreshes_total", "gateway")
    routed = server.by_label("kvroute_router_decision_seconds_count", "gateway")
    return {g: (sent[g], received.get(g, 0.0), refreshes.get(g, 0.0)) for g in sent
            if routed.get(g, 0.0) > 0}


def settled(server: Server) -> dict[str, float]:
    """Each router's received count once it holds still: the same in two reads, the second
    from series refreshed twice since the first (a router pushes its series once a
    second), so the marks of the traffic before have all arrived."""
    last = shared_decisions(server)
    for _ in range(30):
        def refreshed(first=last) -> dict | None:
            now = shared_decisions(server)
            return now if all(now.get(g, (0, 0, 0))[2] >= f[2] + 2
                              for g, f in first.items()) else None
        now = wait_until(refreshed, 60, "the routers' series to be refreshed")
        if {g: r for g, (_, r, _) in now.items()} == {g: r for g, (_, r, _) in last.items()}:
            return {g: r for g, (_, r, _) in now.items()}
        last = now
    raise AssertionError(f"the routers' shared decisions never held still: {last}")


def applied_since(server: Server, base: dict[str, float], decided: Counter[str]) -> bool:
    """Every router has applied, since `base`, each decision of `decided` (by router) that
    another router made."""
    total = sum(decided.values())
    return all(received >= base[g] + total - decided[g]
               for g, (_, received, _) in shared_decisions(server).items() if g in base)


def send_groups(server: Server, headers: dict[str, str], first_group: int = 0
                ) -> list[list[Answer]]:
    """Every group's answers, in order; the groups (`first_group` and the next ones, a
    prefix no earlier traffic sent when the server has run it before) side by side, in
    steps."""
    wait_routed(server.base_url, headers)
    base = settled(server)
    decided: Counter[str] = Counter()
    groups: list[list[Answer]] = [[] for _ in range(NUM_GROUPS)]
    with concurrent.futures.ThreadPoolExecutor(NUM_GROUPS) as pool:
        for i in range(PROMPTS_PER_GROUP):
            if i:
                wait_until(partial(applied_since, server, base, Counter(decided)), 60,
                           "every router to apply the decisions the others shared")
            step = pool.map(partial(send_prompt, server.base_url, headers, i=i),
                            range(first_group, first_group + NUM_GROUPS))
            for answers, answer in zip(groups, step):
                answers.append(answer)
                decided[answer.router_id] += 1
    return groups


def hit_rate(groups: list[list[Answer]]) -> float:
    answers = [a for g in groups for a in g]
    return sum(a.cached_tokens for a in answers) / sum(a.prompt_tokens for a in answers)
