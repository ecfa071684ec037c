"""Token sampling on rank 0: greedy, temperature, top-k, top-p, min-p, per-request seeds,
the min_tokens mask and log-probabilities.

Each request is sampled on its own row, so one whose sampling fails (a row of NaN logits,
every token masked) ends alone with a `SampleFailure`: the step goes on for the others.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from protocol.engine import SampledToken, SampleFailure, SamplingParams, TokenLogprobs

# Below this temperature a row is sampled greedily (as vLLM does): dividing the logits by a
# near-zero temperature overflows them to infinities and the softmax to NaN.
MIN_TEMPERATURE = 1e-5


class Sampler:
    """Samples one token per logits row. A seeded request gets its own generator, created
    at its first token and kept until `release`, so the same seed gives the same output
    whatever else is in the batch."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def sample_step(self, logits: torch.Tensor, request_ids: list[str],
                    params: list[SamplingParams],
                    suppressed_token_ids: Sequence[Sequence[int]] | None = None
                    ) -> dict[str, SampledToken | SampleFailure]:
        """A step's sampled tokens with their log-probabilities, by request id; a request
        whose sampling failed gets a SampleFailure (see `sample`)."""
        tokens = self.sample(logits, request_ids, params, suppressed_token_ids)
        ok = [row for row, t in enumerate(tokens) if isinstance(t, int)]
        logprobs = self.logprobs(logits[ok], [tokens[row] for row in ok],
                                 [params[row] for row in ok])
        out: dict[str, SampledToken | SampleFailure] = {
            request_ids[row]: SampledToken(tokens[row], lp) for row, lp in zip(ok, logprobs)}
        for row, token in enumerate(tokens):
            if isinstance(token, SampleFailure):
                out[request_ids[row]] = token
        return out

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams],
               suppressed_token_ids: Sequence[Sequence[int]] | None = None
               ) -> list[int | SampleFailure]:
        """logits: [N, vocab] fp32, one row per request, in `request_ids` order.
        `suppressed_token_ids[row]`: tokens that row must not sample (EOS and stop tokens
        of a request short of its min_tokens). A row that cannot be sampled gets a
        SampleFailure naming why; the other rows are unaffected."""
        out: list[int | SampleFailure] = []
        for row, (rid, sp) in enumerate(zip(request_ids, params)):
            banned = suppressed_token_ids[row] if suppressed_token_ids is not None else ()
            try:
                out.append(self._sample_row(logits[row], rid, sp, banned))
            except (IndexError, RuntimeError, ValueError) as err:
                out.append(SampleFailure(f"sampling failed: {err}"))
        return out

    def _sample_row(self, row: torch.Tensor, request_id: str, sp: SamplingParams,
                    banned: Sequence[int]) -> int:
        row = row.float()  # [vocab]
        if banned:
            row = row.index_fill(0, torch.tensor(banned, dtype=torch.long), float("-inf"))
        best = row.max()
        if not torch.isfinite(best):
            raise ValueError("no token can be sampled: every logit is masked or not finite")
        if sp.temperature < MIN_TEMPERATURE:
            return int(row.argmax())
        probs = self._probs(row.cpu(), sp)
        return int(torch.multinomial(probs, 1, generator=self._generator(request_id, sp)))

    @staticmethod
    def logprobs(logits: torch.Tensor, token_ids: list[int], params: list[SamplingParams]
                 ) -> list[TokenLogprobs | None]:
        """Per row, the sampled token's log-probability under the raw logits (the model's
        own distribution: before temperature, top-k, top-p and the min_tokens mask, as
        vLLM reports them by default) and the `logprobs` most likely tokens'; None for a
        row that did not ask."""
        rows = [row for row, sp in enumerate(params) if sp.logprobs is not None]
        out: list[TokenLogprobs | None] = [None] * len(params)
        if not rows:
            return out
        log_probs = torch.log_softmax(logits[rows].float(), dim=-1)  # [R, vocab]
        k = max(params[row].logprobs for row in rows)
        top_values, top_ids = torch.topk(log_probs, k, dim=-1) if k else (None, None)
        for i, row in enumerate(rows):
            token_id = token_ids[row]
            top: tuple[tuple[int, float], ...] = ()
            if params[row].logprobs:
                n = params[row].logprobs
                top = tuple(zip(top_ids[i, :n].tolist(), top_values[i, :n].tolist()))
            out[row] = TokenLogprobs(token_id, float(log_probs[i, token_id]), top)
        return out

    def _generator(self, request_id: str, sp: SamplingParams) -> torch.Generator | None:
        if sp.seed is None:
            return None
        gen = self._generators.get(request_id)
        if gen is None:
            gen = self._generators[request_id] = torch.Generator().manual_seed(sp.seed)
        return gen

    @staticmethod
    def _probs(row: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
        row = row / sp.temperature  # [vocab]
        if 0 < sp.top_k < row.numel():
            kth = torch.topk(row, sp.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if sp.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= sp.top_p  # keep the first
            row = row.scatter(0, order[drop], float("-inf"))
        probs = torch.softmax(row, dim=-1)
        if sp.min_p > 0:  # the most likely token always stays: its ratio is 1
            probs = probs.masked_fill(probs < sp.min_p * probs.max(), 0.0)
        return probs

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)


def suppressed_token_ids(sp: SamplingParams, num_output_tokens: int,
                         eos_token_ids: tuple[int, ...]) -> tuple[int, ...]:
    """The tokens a request may not sample next: EOS (unless ignored) and its stop token
    ids while it has fewer than min_tokens output tokens; none after."""
    if num_output_tokens >= sp.min_tokens:
        return ()
    return sp.stop_token_ids + (() if sp.ignore_eos else eos_token_ids)
