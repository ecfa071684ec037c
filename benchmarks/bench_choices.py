"""n > 1 on one simulated engine replica (modelled step times): n choices of one prompt,
started together (worker/openai/choices.py), against n different prompts of the same length
(what the copies would cost if each computed the prompt).

    python benchmarks/bench_choices.py [--n 8] [--prompt-tokens 4000] [--max-tokens 64]
        [--sim-preset l4-llama3-8b] [--max-num-batched-tokens 2048]

Prints, per way: prompt tokens the engine computed (prompt tokens minus cache hits, from
the usage of every choice), the time to the last choice's first token and to the whole
response (wall clock: the simulated executor sleeps each step's modelled time).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kv.hashing import DEFAULT_BLOCK_SIZE  # noqa: E402
from protocol.engine import EngineRequest, SamplingParams  # noqa: E402
from worker.engine.config import EngineConfig  # noqa: E402
from worker.engine.factory import build_engine  # noqa: E402
from worker.openai.choices import Choices, collect  # noqa: E402


async def run(same_prompt: bool, args) -> tuple[int, float, float]:
    engine = build_engine(EngineConfig(model="tiny", engine="sim", sim_preset=args.sim_preset,
                                       num_blocks=4096, block_size=DEFAULT_BLOCK_SIZE,
                                       max_model_len=args.prompt_tokens + args.max_tokens + 1,
                                       max_num_batched_tokens=args.max_num_batched_tokens))

    def prompt(i: int) -> list[int]:
        return [3 + (i * 7919 + j) % 250 for j in range(args.prompt_tokens)]

    requests = [EngineRequest(f"r{i}", prompt(0 if same_prompt else i + 1),
                              SamplingParams(max_tokens=args.max_tokens, ignore_eos=True))
                for i in range(args.n)]
    start = time.perf_counter()
    choices = Choices(requests, args.n if same_prompt else 1, engine.generate)
    await choices.start()
    last_first_s = time.perf_counter() - start
    usages = [out.usage for out in await collect(choices)]
    total_s = time.perf_counter() - start
    await engine.shutdown()
    return sum(u.prompt_tokens - u.cached_tokens for u in usages), last_first_s, total_s


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=8)
    p.add_argument("--prompt-tokens", type=int, default=4000)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--sim-preset", default="l4-llama3-8b")
    p.add_argument("--max-num-batched-tokens", type=int, default=2048)
    args = p.parse_args(argv)
    print(f"n={args.n}, {args.prompt_tokens}-token prompt, {args.max_tokens} out, "
          f"preset {args.sim_preset}, {args.max_num_batched_tokens} batched tokens a step")
    for same_prompt, way in ((True, "n choices of one prompt"), (False, "n different prompts")):
        computed, first_s, total_s = asyncio.run(run(same_prompt, args))
        print(f"{way:>23}: prompt tokens computed {computed:>7,}, last first token "
              f"{first_s * 1e3:8.1f} ms, whole response {total_s * 1e3:8.1f} ms")


if __name__ == "__main__":
    main()
