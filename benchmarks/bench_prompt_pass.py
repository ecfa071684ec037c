"""What one pass over a prompt costs: reading a chat body for routing, as the default path
does twice (the ingress router to route it, the engine replica's OpenAI front to run it).

    python benchmarks/bench_prompt_pass.py [--model smollm2] [--repeats 50]

One pass is `RouteCalls.of` (router/serve/route_calls.py): the body's limits, JSON parse,
the chat template, the tokenizer and the Protocol 1 block hashes. The engine replica's
pass does the same work through `OpenAIServing` plus its own request checks, so this is a
lower bound on what the second pass costs. Chat bodies of several lengths (English-like
words from a fixed seed), each read `--repeats` times in this thread; the median thread
CPU time is reported (not wall time: the box's load does not inflate it). Last line: JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from router.front.tenants import TenantAuth  # noqa: E402
from router.serve.route_calls import RouteCalls  # noqa: E402
from worker.openai.limits import RequestLimits  # noqa: E402
from worker.openai.prompt import PromptBuilder  # noqa: E402
from worker.tokenizer.files import tokenizer_dir  # noqa: E402

WORDS = ("the cache of a prefix is kept on one replica so that every request sharing it "
         "finds its blocks there and computes only what is new model router token").split()


def chat_body(num_words: int, seed: int) -> bytes:
    rng = random.Random(seed)
    text = " ".join(rng.choice(WORDS) for _ in range(num_words))
    return json.dumps({"model": "m", "max_tokens": 16, "messages": [
        {"role": "system", "content": "You are a helpful assistant."},
        {"role": "user", "content": text}]}).encode()


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="smollm2", help="whose tokenizer and chat template")
    p.add_argument("--words", default="200,800,3200", help="user message lengths, in words")
    p.add_argument("--repeats", type=int, default=50)
    args = p.parse_args(argv)
    prompts = PromptBuilder(tokenizer_dir(args.model), args.model, block_size=DEFAULT_BLOCK_SIZE)
    calls = RouteCalls(prompts, TenantAuth({}), max_model_len=1 << 20, limits=RequestLimits())
    rows = []
    for num_words in (int(w) for w in args.words.split(",")):
        body = chat_body(num_words, seed=num_words)
        call = calls.of(body, None)
        if call is None:
            raise RuntimeError(f"a body of {num_words} words was not routable")
        cpu_us = []
        for _ in range(args.repeats):
            start = time.thread_time_ns()
            calls.of(body, None)
            cpu_us.append((time.thread_time_ns() - start) / 1000)
        rows.append({"prompt_tokens": len(call.prompt_token_ids),
                     "pass_cpu_us_p50": round(statistics.median(cpu_us), 1)})
        print(f"{rows[-1]['prompt_tokens']:>6} prompt tokens: one pass "
              f"{rows[-1]['pass_cpu_us_p50']:>8.1f} us CPU (median of {args.repeats})")
    out = {"model": args.model, "passes": rows, "load_average_1m": round(os.getloadavg()[0], 2)}
    print(json.dumps(out))
    return out


if __name__ == "__main__":
    main()
