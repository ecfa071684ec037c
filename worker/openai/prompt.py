"""The gateway's prompt pipeline: text or chat messages -> token ids -> block hashes, once.

The engine uses the ids it is sent, so router and engine hash the same tokens by
construction. The chat template is the checkpoint's own (tokenizer_config.json or
chat_template.jinja) rendered with jinja2 the way Hugging Face does, without transformers.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from kv.hashing import BlockHash, block_hashes, namespace_root
from worker.tokenizer.files import load_tokenizer_files

# Text at least this long is encoded with the GIL released (the tokenizer's batch call
# releases it, its single call does not), so a thread tokenizing a long prompt lets the
# event loop's thread run; shorter text is faster through the single call.
_RELEASE_GIL_CHARS = 2048


class PromptError(ValueError):
    """A prompt the model cannot take (the gateway answers 400)."""


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


class PromptBuilder:
    """Tokenizes prompts and hashes their blocks for one served model."""

    def __init__(self, model_dir: str | Path, model_name: str, block_size: int):
        files = load_tokenizer_files(model_dir)
        self.tokenizer = Tokenizer.from_file(str(files.tokenizer_path))
        self.model_name = model_name
        self.block_size = block_size
        self._bos_token = files.bos_token or ""
        self._eos_token = files.eos_token or ""
        self._template = None
        if files.chat_template is not None:
            env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
            env.globals["raise_exception"] = _raise_exception
            self._template = env.from_string(files.chat_template)
        self._roots: dict[str, BlockHash] = {}

    @property
    def has_chat_template(self) -> bool:
        return self._template is not None

    def encode_text(self, text: str) -> list[int]:
        """A completion prompt: the tokenizer's own special tokens (BOS) included."""
        return self._encode(text, add_special_tokens=True)

    def render_chat(self, messages: Sequence[dict[str, Any]],
                    add_generation_prompt: bool = True) -> str:
        if self._template is None:
            raise PromptError("this model has no chat template; use /v1/completions")
        try:
            return self._template.render(messages=list(messages),
                                         add_generation_prompt=add_generation_prompt,
                                         bos_token=self._bos_token,
                                         eos_token=self._eos_token)
        except TemplateError as err:
            raise PromptError(f"the chat template rejected the messages: {err}") from None

    def encode_chat(self, messages: Sequence[dict[str, Any]]) -> list[int]:
        """Chat messages through the template; the template writes the special tokens."""
        return self._encode(self.render_chat(messages), add_special_tokens=False)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        if len(text) < _RELEASE_GIL_CHARS:
            return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def block_hashes(self, token_ids: Sequence[int], cache_salt: str = "") -> list[BlockHash]:
        """Protocol 1 hashes of the prompt's full blocks in the tenant's namespace."""
        root = self._roots.get(cache_salt)
        if root is None:
            root = self._roots[cache_salt] = namespace_root(self.model_name, "", cache_salt)
        return block_hashes(token_ids, self.block_size, root)
