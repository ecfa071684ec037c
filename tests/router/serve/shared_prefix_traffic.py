"""Shared-prefix traffic for the several-routers test (test_serve_direct.py), bench_e2e's
shape at a small size: groups of prompts share a system prompt; the groups run side by
side, and within a group each prompt is sent once the previous one answered.

HAProxy spreads the routing calls over the ingress routers, so with two the prompt after a
group's first usually reaches the router that did not route the first, before the
replica's KV events reach that router: it follows the prefix through the pending marks the
other router shared (router/cluster/shared_marks.py). One router or two, each group's
first prompt misses and every later one finds the group's whole system prompt cached.
"""

from __future__ import annotations

import concurrent.futures
from typing import NamedTuple

import httpx

from router.serve.route_tracking import ROUTED_BY_HEADER
from tests.router.serve.serve_helpers import wait_until

BLOCK_SIZE = 16
NUM_GROUPS, PROMPTS_PER_GROUP = 4, 4
# the tiny model's tokenizer is bytes plus BOS: 511 + 1 tokens, 32 whole blocks
SYSTEM_TOKENS = 32 * BLOCK_SIZE


class Answer(NamedTuple):
    prompt_tokens: int
    cached_tokens: int
    router_id: str | None  # the ingress router that routed it (None: none did)


def system_prompt(group: int) -> str:
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


def run_group(base_url: str, headers: dict[str, str], group: int) -> list[Answer]:
    out = []
    with httpx.Client(base_url=base_url, timeout=60, headers=headers) as http:
        for i in range(PROMPTS_PER_GROUP):
            resp = http.post("/v1/completions", json={
                "model": "tiny", "prompt": system_prompt(group) + f" Question {i}?",
                "max_tokens": 2, "temperature": 0})
            assert resp.status_code == 200, resp.text
            usage = resp.json()["usage"]
            out.append(Answer(usage["prompt_tokens"],
                              usage["prompt_tokens_details"]["cached_tokens"],
                              resp.headers.get(ROUTED_BY_HEADER)))
    return out


def send_groups(base_url: str, headers: dict[str, str]) -> list[list[Answer]]:
    """Every group's answers, in order; the groups side by side."""
    wait_routed(base_url, headers)
    with concurrent.futures.ThreadPoolExecutor(NUM_GROUPS) as pool:
        return list(pool.map(lambda g: run_group(base_url, headers, g), range(NUM_GROUPS)))


def hit_rate(groups: list[list[Answer]]) -> float:
    answers = [a for g in groups for a in g]
    return sum(a.cached_tokens for a in answers) / sum(a.prompt_tokens for a in answers)
