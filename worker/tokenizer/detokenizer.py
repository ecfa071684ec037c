"""Incremental detokenization with stop strings."""

from __future__ import annotations

from tokenizers import Tokenizer
from tokenizers.decoders import DecodeStream


class IncrementalDetokenizer:
    """Turns a growing list of output token ids into text deltas.

    Each new token is decoded once, by tokenizers' DecodeStream (it holds back a byte-level
    token that ends in the middle of a UTF-8 character until the next one completes it), so
    a step costs the new tokens, not the whole output again. The final step decodes the
    whole output once, so the text is exactly `decode(all ids)`. Stop strings are matched
    on the text from where the last emitted text could still begin one; the text is cut
    before the stop string and the request stops. Until the output has more than
    `min_tokens` tokens no stop string ends it (vLLM's min_tokens).
    """

    def __init__(self, tokenizer: Tokenizer, stop: tuple[str, ...] = (), min_tokens: int = 0):
        self.tokenizer = tokenizer
        self.stop = stop
        self.min_tokens = min_tokens
        self.text = ""  # text already emitted
        self._decoded = ""  # text decoded so far: emitted, then held back
        self._num_decoded = 0  # output tokens fed to the stream
        self._stream = DecodeStream(skip_special_tokens=True)
        self._max_stop_chars = max((len(s) for s in stop), default=0)

    def step(self, output_token_ids: list[int], final: bool) -> tuple[str, bool]:
        """Returns (new text, stop string hit)."""
        if final:
            full = self.tokenizer.decode(output_token_ids, skip_special_tokens=True)
        else:
            for token_id in output_token_ids[self._num_decoded:]:
                piece = self._stream.step(self.tokenizer, token_id)
                if piece:
                    self._decoded += piece
            self._num_decoded = len(output_token_ids)
            full = self._decoded
        stops = self.stop if len(output_token_ids) > self.min_tokens else ()
        for s in stops:
            # A stop string that ends in the emitted text was emitted while stops were off
            # (min_tokens): only one that reaches past it stops.
            cut = full.find(s, max(0, len(self.text) - len(s) + 1))
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
