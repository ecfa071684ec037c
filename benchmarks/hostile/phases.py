"""The attacks that need more than one request: the pin quota race (direct front) and the
lying worker with its huge KV event batches (workers front)."""

from __future__ import annotations

import concurrent.futures
import threading

import httpx

from benchmarks.hostile.client import SSL_CONTEXT
from benchmarks.hostile.fronts import PIN_QUOTA_BLOCKS, PIN_QUOTA_NAMES, Front
from benchmarks.hostile.liar import HugeBatchPublisher, LyingWorker
from kv.hashing import DEFAULT_BLOCK_SIZE

TENANT_HEADER = "X-Kvroute-Tenant"
RACERS = 10
# 30 blocks with BOS: two fit the 64-block quota, three do not
PIN_TOKENS = 30 * DEFAULT_BLOCK_SIZE - 1


def quota_race(front: Front) -> dict:
    """RACERS concurrent pin registers for the hostile tenant against its quota; what it
    holds after, by its own listing, and everything it got is unpinned again."""
    headers = {**front.admin_headers, TENANT_HEADER: "hostile"}

    def register(i: int) -> int:
        body = {"model": "tiny", "name": f"race-{i}", "prompt": f"{i:03d}" + "p" * PIN_TOKENS}
        try:
            return httpx.post(f"{front.base_url}/v1/prefixes", json=body, headers=headers,
                              verify=SSL_CONTEXT,
                              timeout=120).status_code
        except httpx.HTTPError:
            return 0

    with concurrent.futures.ThreadPoolExecutor(RACERS) as pool:
        statuses = list(pool.map(register, range(RACERS)))
    listed = httpx.get(f"{front.base_url}/v1/prefixes", headers=front.hostile_headers,
                       timeout=30).json().get("data", [])
    names = len(listed)
    blocks = sum(p.get("num_pinned_blocks") or 0 for p in listed)
    for p in listed:
        httpx.delete(f"{front.base_url}/v1/prefixes/{p['name']}", headers=headers, timeout=60)
    return {"statuses": sorted(statuses), "pinned_names": names, "pinned_blocks": blocks,
            "quota_names": PIN_QUOTA_NAMES, "quota_blocks": PIN_QUOTA_BLOCKS,
            "over_quota": names > PIN_QUOTA_NAMES or blocks > PIN_QUOTA_BLOCKS}


def _hostile_completion(front: Front, i: int) -> tuple[str, int]:
    """(status, bytes the hostile client received)."""
    body = {"model": "tiny", "prompt": f"liar bait {i} " * 20, "max_tokens": 4,
            "stream": i % 2 == 1}
    received = 0
    try:
        with httpx.stream("POST", f"{front.base_url}/v1/completions", json=body,
                          verify=SSL_CONTEXT,
                          headers=front.hostile_headers, timeout=60) as resp:
            for chunk in resp.iter_bytes():
                received += len(chunk)
            return str(resp.status_code), received
    except httpx.HTTPError as err:
        return type(err).__name__, received


def lying_worker(front: Front, num_requests: int = 16, num_batches: int = 6) -> dict:
    """Adds a lying worker (NaN gauges, redirects, huge bodies) whose KV events are huge
    batches, sends hostile requests meanwhile, then removes it."""
    liar, publisher = LyingWorker(), HugeBatchPublisher()
    admin = f"{front.base_url}/v1/workers"
    try:
        added = httpx.post(admin, headers=front.admin_headers, timeout=60, json={
            "url": liar.url, "kv_events": publisher.endpoint,
            "kv_replay": publisher.replay_endpoint})
        sender = threading.Thread(target=publisher.send, args=(num_batches,), daemon=True)
        sender.start()
        answers = [_hostile_completion(front, i) for i in range(num_requests)]
        sender.join()
        httpx.request("DELETE", admin, headers=front.admin_headers, params={"url": liar.url},
                      timeout=60)
    finally:
        liar.close()
        publisher.close()
    return {"added": added.status_code, "liar_requests": liar.requests,
            "redirects_followed": liar.trap_hits,
            "max_relayed_bytes": max((b for _, b in answers), default=0),
            "statuses": sorted({s for s, _ in answers}),
            "batch_bytes": len(publisher.payload), "batches_sent": publisher.sent}
