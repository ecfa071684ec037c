"""Incremental detokenization with stop strings."""

from __future__ import annotations

from tokenizers import Tokenizer


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Byte-level tokens can end in the middle of a UTF-8 character; text ending in U+FFFD is
    held back until the next token completes it. Stop strings are matched on the whole
    output; the text is cut before the stop string and the request stops.
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.text = ""  # text already emitted
        self._max_stop_chars = max((len(s) for s in stop), default=0)

    def step(self, output_token_ids: list[int], final: bool) -> tuple[str, bool]:
        """Returns (new text, stop string hit)."""
        full = self.tokenizer.decode(output_token_ids, skip_special_tokens=True)
        for s in self.stop:
            cut = full.find(s, max(0, len(self.text) - len(s)))
            if cut != -1:
                delta = full[len(self.text) : cut] if cut >= len(self.text) else ""
                self.text += delta
                return delta, True
        if not final:
            if full.endswith("\ufffd"):
                return "", False
            # Hold back what could still become the start of a stop string.
            safe = len(full) - self._max_stop_chars + 1 if self._max_stop_chars else len(full)
            full = full[: max(safe, len(self.text))]
        delta = full[len(self.text) :]
        self.text += delta
        return delta, False
