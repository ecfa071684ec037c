"""The built-in smollm2 and its oracle, transformers reading the same GGUF file (fp32):
shared prompts and loaders for the GGUF tests and benchmarks/bench_real_model.py."""

from __future__ import annotations

from functools import cache
from pathlib import Path

import torch

from worker.model.gguf.builtin import smollm2_gguf_path
from worker.openai.prompt import PromptBuilder
from worker.tokenizer.files import checkpoint_dir

_TOWNS = ("Alder", "Brook", "Cedar", "Dunmore", "Elm", "Fairholt", "Glen", "Harrow")
_GOODS = ("barley", "wool", "salt", "timber", "apples", "copper", "linen", "honey")


def long_document(num_sections: int) -> str:
    """A deterministic, varied English text (about 45 tokens per section)."""
    lines = []
    for i in range(num_sections):
        town, good = _TOWNS[i % len(_TOWNS)], _GOODS[(i * 3) % len(_GOODS)]
        lines.append(f"Record {i + 1}: in the year {1700 + 7 * i}, the market of {town} "
                     f"traded {120 + 13 * i} carts of {good}; the council noted that "
                     f"{'the roads were poor' if i % 3 else 'the river ran high'} and "
                     f"prices rose by {i % 9 + 1} percent.")
    return "\n".join(lines)


CHATS: list[list[dict[str, str]]] = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "Write a Python function that adds two numbers."}],
    [{"role": "user", "content": "Name three colours."},
     {"role": "assistant", "content": "Red, green and blue."},
     {"role": "user", "content": "And three fruits?"}],
    [{"role": "user", "content": "Traduis en anglais : « le café est très chaud ». 😀"}],
    [{"role": "system", "content": "You summarise documents.\n\n" + long_document(26)},
     {"role": "user", "content": "Which town traded salt first?"}],
]


def gguf_path() -> Path:
    return smollm2_gguf_path()


@cache
def prompts() -> PromptBuilder:
    return PromptBuilder(checkpoint_dir("smollm2", weights=False), "smollm2", 16)


def chat_ids(messages: list[dict[str, str]]) -> list[int]:
    return prompts().encode_chat(messages)


def load_hf_model():
    """transformers' model from the GGUF file itself (its own dequantization), fp32."""
    from transformers import AutoModelForCausalLM

    path = gguf_path()
    return AutoModelForCausalLM.from_pretrained(
        path.parent, gguf_file=path.name, dtype=torch.float32,
        attn_implementation="eager").eval()


def load_hf_tokenizer():
    from transformers import AutoTokenizer

    path = gguf_path()
    return AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)


def hf_greedy(model, token_ids: list[int], max_new_tokens: int) -> list[int]:
    """transformers' greedy continuation (stops at the model's eos, which it keeps)."""
    with torch.no_grad():
        out = model.generate(torch.tensor([token_ids]), max_new_tokens=max_new_tokens,
                             do_sample=False, top_p=None, top_k=None, temperature=None,
                             attention_mask=torch.ones(1, len(token_ids), dtype=torch.long))
    return out[0, len(token_ids):].tolist()
