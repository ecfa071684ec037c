"""What bench_peers.py reads from one run: the workers' own counters, and the bound.

- Work per worker (the simulator's load-share definition, benchmarks/simlib/report.py):
  tokens the worker computed, uncached prompt tokens plus generated tokens, read from its
  `kvroute_engine_*` counters before and after the run (the difference: warm-up excluded).
- The pooled bound: one LRU with all workers' blocks serving the prompts exactly as sent,
  in the order sent (benchmarks/simlib/pooled.py). A text prompt is the ids the workers'
  byte-level tokenizer gives it: <s> (256), then its UTF-8 bytes.
"""

from __future__ import annotations

from collections.abc import Sequence

import httpx
from prometheus_client.parser import text_string_to_metric_families

from benchmarks.simlib.openai_load import HttpRecord
from benchmarks.simlib.pooled import PooledLRU
from kv.hashing import DEFAULT_BLOCK_SIZE, block_hashes, namespace_root

BOS_TOKEN_ID = 256
_COUNTERS = {"kvroute_engine_prefix_cache_query_tokens_total": "query_tokens",
             "kvroute_engine_prefix_cache_hit_tokens_total": "hit_tokens",
             "kvroute_engine_generation_tokens_total": "generation_tokens",
             "kvroute_engine_requests_finished_total": "requests"}


def worker_counters(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=30).text
    out = dict.fromkeys(_COUNTERS.values(), 0.0)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            key = _COUNTERS.get(s.name)
            if key is not None:
                out[key] += s.value
    return out


def load_shares(before: Sequence[dict[str, float]], after: Sequence[dict[str, float]]
                ) -> dict[str, float]:
    """The busiest worker's work (and requests) over the mean worker's."""
    work, reqs = [], []
    for b, a in zip(before, after):
        d = {k: a[k] - b[k] for k in a}
        work.append(d["query_tokens"] - d["hit_tokens"] + d["generation_tokens"])
        reqs.append(d["requests"])

    def share(xs: list[float]) -> float:
        mean = sum(xs) / len(xs)
        return max(xs) / mean if mean else 1.0
    return {"load_share": share(work), "request_share": share(reqs),
            "worker_work_tokens": work, "worker_requests": reqs,
            "worker_hit_tokens": sum(a["hit_tokens"] - b["hit_tokens"]
                                     for b, a in zip(before, after))}


def prompt_token_ids(prompt: list[int] | str) -> list[int]:
    if isinstance(prompt, str):
        return [BOS_TOKEN_ID, *prompt.encode("utf-8")]
    return list(prompt)


def pooled_bound(records: Sequence[HttpRecord], capacity_blocks: int, model: str,
                 block_size: int = DEFAULT_BLOCK_SIZE) -> float:
    bound = PooledLRU(capacity_blocks, block_size)
    root = namespace_root(model)
    for rec in sorted(records, key=lambda r: r.sent_s):
        assert rec.prompt is not None
        ids = prompt_token_ids(rec.prompt)
        bound.serve_prompt(block_hashes(ids, block_size, root), len(ids))
    return bound.hit_rate
