"""A server's prompts to token ids without stalling its event loop.

Tokenizing is the one step of a request whose cost grows with what the client sent: 1M
characters hold the tokenizer for over a second, and an event loop that serves every
tenant's streams must not wait on it. So text that cannot fit the context whatever it
tokenizes to is refused first (no token stands for more characters than the vocabulary's
longest piece), and a long request is tokenized in a thread (the tokenizer releases the GIL
on long text: worker/openai/prompt.py); a short one stays on the loop, where it costs less
than the hop to a thread.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from worker.openai.errors import APIError
from worker.openai.limits import check_text_fits, longest_token_chars
from worker.openai.prompt import PromptBuilder, PromptError

T = TypeVar("T")
INLINE_TEXT_CHARS = 8 * 1024  # tokenized on the loop up to this many characters (a few ms)
_THREADS = 2


class PromptEncoder:
    def __init__(self, prompts: PromptBuilder):
        self.prompts = prompts
        self.max_token_chars = longest_token_chars(
            prompts.tokenizer.get_vocab(with_added_tokens=True))
        self._threads = ThreadPoolExecutor(_THREADS, thread_name_prefix="kvroute-tokenize")

    async def completion(self, prompts: Sequence[str | Sequence[int]],
                         max_model_len: int) -> list[list[int]]:
        """A completion's prompts (text or token ids) as token ids; 400 when a text cannot
        fit the context."""
        texts = [p for p in prompts if isinstance(p, str)]
        for text in texts:
            check_text_fits(len(text), max_model_len, self.max_token_chars, "prompt")
        return await self._run(sum(map(len, texts)), lambda: [
            self.prompts.encode_text(p) if isinstance(p, str) else list(p) for p in prompts])

    async def chat(self, messages: list[dict[str, Any]], max_model_len: int) -> list[int]:
        """Chat messages through the template; 400 when their text cannot fit the context
        or the template refuses them."""
        num_chars = sum(len(m["content"]) for m in messages)
        check_text_fits(num_chars, max_model_len, self.max_token_chars, "messages")
        try:
            return await self._run(num_chars, lambda: self.prompts.encode_chat(messages))
        except PromptError as err:
            raise APIError(400, str(err), param="messages") from None

    async def _run(self, num_chars: int, work: Callable[[], T]) -> T:
        if num_chars <= INLINE_TEXT_CHARS:
            return work()
        return await asyncio.get_running_loop().run_in_executor(self._threads, work)
