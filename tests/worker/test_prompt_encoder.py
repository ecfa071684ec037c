"""A server's prompts to token ids: text that cannot fit the context is refused before it is
tokenized, and a long prompt is tokenized off the event loop (same ids)."""

import asyncio

import pytest

from worker.openai.errors import APIError
from worker.openai.prompt import PromptBuilder
from worker.openai.prompt_encoder import INLINE_TEXT_CHARS, PromptEncoder
from worker.tokenizer.files import tokenizer_dir


@pytest.fixture(scope="module")
def prompts() -> PromptBuilder:
    return PromptBuilder(tokenizer_dir("tiny"), "tiny", 16)


async def test_text_that_cannot_fit_is_refused_before_tokenizing(prompts, monkeypatch):
    encoder = PromptEncoder(prompts)
    encoded = []
    monkeypatch.setattr(prompts, "_encode", lambda text, **kw: encoded.append(text) or [1])
    too_long = "a" * (64 * encoder.max_token_chars + 1)
    for call in (lambda: encoder.completion(["short", too_long], 64),
                 lambda: encoder.chat([{"role": "user", "content": too_long}], 64)):
        with pytest.raises(APIError) as info:
            await call()
        assert (info.value.status_code, info.value.code) == (400, "context_length_exceeded")
    assert encoded == []
    assert await encoder.completion(["ab", [5, 6]], 64) == [[1], [5, 6]]


async def test_a_long_prompt_is_tokenized_off_the_event_loop(prompts):
    encoder = PromptEncoder(prompts)
    text = "".join(f"word{i} " for i in range(20_000))
    assert len(text) > INLINE_TEXT_CHARS
    ticks = 0

    async def tick() -> None:
        nonlocal ticks
        while True:
            ticks += 1
            await asyncio.sleep(0)

    ticker = asyncio.get_running_loop().create_task(tick())
    await asyncio.sleep(0)
    before = ticks
    [token_ids] = await encoder.completion([text], 1 << 20)
    during = ticks - before
    chat_ids = await encoder.chat([{"role": "user", "content": text}], 1 << 20)
    ticker.cancel()
    assert token_ids == prompts.tokenizer.encode(text).ids  # the same ids
    messages = [{"role": "user", "content": text}]
    assert chat_ids == prompts.tokenizer.encode(prompts.render_chat(messages),
                                                add_special_tokens=False).ids
    assert during > 0  # the loop went on while it was tokenized
