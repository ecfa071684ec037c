"""Shared-prefix chat traffic for a real model: groups of conversations that share a long
system prompt, sent to `/v1/chat/completions` (streamed, greedy, `ignore_eos` so every
answer has the same length), timed like benchmarks/simlib/openai_load.py's records."""

from __future__ import annotations

import asyncio
import json
import random
import time

import aiohttp

from benchmarks.simlib.openai_load import HttpRecord

_TOPICS = ("harbour tolls", "grain stores", "river ferries", "wool markets", "salt roads",
           "mill rights", "bridge repairs", "orchard leases", "fishing weirs", "bell towers")


def system_prompt(group: int, num_sections: int) -> str:
    """A distinct long system prompt per group (its first words already differ)."""
    from tests.worker.model.gguf.smollm2_oracle import long_document

    topic = _TOPICS[group % len(_TOPICS)]
    return (f"Archive {group}: you are the clerk of the {topic} records of district {group}. "
            f"Answer questions about the records below in one sentence.\n\n"
            + long_document(num_sections + group % 3))


def chat_requests(num_groups: int, per_group: int, num_sections: int,
                  seed: int) -> list[tuple[str, list[dict[str, str]]]]:
    """(request_id, messages) in a shuffled order."""
    items = [(f"g{g}-q{q}", [{"role": "system", "content": system_prompt(g, num_sections)},
                             {"role": "user", "content": f"What happened in record {q + 2}?"}])
             for g in range(num_groups) for q in range(per_group)]
    random.Random(seed).shuffle(items)
    return items


async def _one(client: aiohttp.ClientSession, url: str, model: str, request_id: str,
               messages: list[dict[str, str]], max_tokens: int, t0: float) -> HttpRecord:
    rec = HttpRecord(request_id, time.perf_counter() - t0)
    body = {"model": model, "messages": messages, "max_tokens": max_tokens, "stream": True,
            "stream_options": {"include_usage": True}, "ignore_eos": True, "temperature": 0.0}
    try:
        async with client.post(url, json=body) as resp:
            if resp.status != 200:
                rec.error = f"HTTP {resp.status}: {(await resp.read())[:200]!r}"
                return rec
            async for line in resp.content:
                if not line.startswith(b"data:") or line[5:].strip() == b"[DONE]":
                    continue
                chunk = json.loads(line[5:])
                if chunk.get("choices") and rec.first_chunk_s is None:
                    rec.first_chunk_s = time.perf_counter() - t0
                if chunk.get("usage"):
                    usage = chunk["usage"]
                    rec.prompt_tokens = usage["prompt_tokens"]
                    rec.completion_tokens = usage["completion_tokens"]
                    rec.cached_tokens = (usage.get("prompt_tokens_details") or {}).get(
                        "cached_tokens") or 0
    except (aiohttp.ClientError, asyncio.TimeoutError) as err:
        rec.error = f"{type(err).__name__}: {err}"
    rec.done_s = time.perf_counter() - t0
    return rec


async def run_chat_load(base_url: str, model: str,
                        requests: list[tuple[str, list[dict[str, str]]]], max_tokens: int,
                        max_concurrency: int) -> list[HttpRecord]:
    """Sends every request (at most max_concurrency in flight); returns their records."""
    sem = asyncio.Semaphore(max_concurrency)
    url = f"{base_url}/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=1800)) as client:
        t0 = time.perf_counter()

        async def limited(request_id: str, messages: list[dict[str, str]]) -> HttpRecord:
            async with sem:
                return await _one(client, url, model, request_id, messages, max_tokens, t0)

        return list(await asyncio.gather(*(limited(r, m) for r, m in requests)))
