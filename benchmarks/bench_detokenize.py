"""Detokenizing cost per output token: kvroute's incremental detokenizer against decoding
the whole output again at every token (what it did before).

    python benchmarks/bench_detokenize.py [--tokens 2000]

On the embedded tiny model's byte-level tokenizer, one stop string; each step is given the
output so far, as the engine does. Prints microseconds per token for both.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from tokenizers import Tokenizer

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from worker.tokenizer.detokenizer import IncrementalDetokenizer  # noqa: E402
from worker.tokenizer.files import load_tokenizer_files, tokenizer_dir  # noqa: E402


def per_token_us(step, ids: list[int]) -> float:
    start = time.perf_counter()
    for n in range(1, len(ids) + 1):
        step(ids[:n], n == len(ids))
    return (time.perf_counter() - start) / len(ids) * 1e6


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=2000)
    args = p.parse_args(argv)
    tok = Tokenizer.from_file(str(load_tokenizer_files(tokenizer_dir("tiny")).tokenizer_path))
    text = "The quick brown fox jumps over the lazy dog. " * (args.tokens // 40 + 1)
    ids = tok.encode(text, add_special_tokens=False).ids[:args.tokens]
    whole = per_token_us(lambda out, final: tok.decode(out, skip_special_tokens=True), ids)
    incremental = per_token_us(IncrementalDetokenizer(tok, ("zzz",)).step, ids)
    print(f"{len(ids)} tokens: whole decode each step {whole:.1f} us/token, "
          f"incremental {incremental:.1f} us/token ({whole / incremental:.1f}x)")


if __name__ == "__main__":
    main()
