"""The engine's per-token log-probabilities in OpenAI's two shapes.

Completions (legacy): `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`, one
entry per output token; each `top_logprobs` entry maps token text to logprob for the k most
likely tokens plus the sampled one (vLLM's shape). Chat: `{"content": [{"token", "logprob",
"bytes", "top_logprobs": [...]}], "refusal": null}` with exactly the k most likely in
`top_logprobs`. A token's text is that token decoded alone (tokens of the same text, such as
byte tokens that are parts of one UTF-8 character, share one key in a completion's
`top_logprobs`, the sampled token's value winning).
"""

from __future__ import annotations

from typing import Any

from tokenizers import Tokenizer

from protocol.engine import TokenLogprobs


class LogprobsFormatter:
    """Formats log-probabilities for one served model (token texts cached)."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._texts: dict[int, str] = {}

    def token_text(self, token_id: int) -> str:
        text = self._texts.get(token_id)
        if text is None:
            text = self.tokenizer.decode([token_id], skip_special_tokens=False)
            if len(self._texts) < 1 << 20:  # a vocabulary's worth at most
                self._texts[token_id] = text
        return text

    def completion(self, entries: list[TokenLogprobs], text_offset: int = 0
                   ) -> tuple[dict[str, Any], int]:
        """The body, and where the next token's text starts. `text_offset`: where the
        first token's starts (the token texts' lengths so far: a stream carries it from
        chunk to chunk)."""
        tokens, offsets, tops = [], [], []
        for entry in entries:
            text = self.token_text(entry.token_id)
            tokens.append(text)
            offsets.append(text_offset)
            text_offset += len(text)
            top = {self.token_text(t): lp for t, lp in entry.top}
            top[text] = entry.logprob  # over another token of the same text
            tops.append(top)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": tops, "text_offset": offsets}, text_offset

    def chat(self, entries: list[TokenLogprobs]) -> dict[str, Any]:
        content = []
        for entry in entries:
            text = self.token_text(entry.token_id)
            content.append({"token": text, "logprob": entry.logprob,
                            "bytes": list(text.encode()),
                            "top_logprobs": [self._alternative(t, lp) for t, lp in entry.top]})
        return {"content": content, "refusal": None}

    def _alternative(self, token_id: int, logprob: float) -> dict[str, Any]:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode())}

