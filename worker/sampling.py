"""Token sampling on rank 0: greedy, temperature, top-k, top-p, per-request seeds."""

from __future__ import annotations

import torch

from worker.api import SamplingParams


class Sampler:
    """Samples one token per logits row. A seeded request gets its own generator, created
    at its first token and kept until `release`, so the same seed gives the same output
    whatever else is in the batch."""

    def __init__(self) -> None:
        self._generators: dict[str, torch.Generator] = {}

    def sample(self, logits: torch.Tensor, request_ids: list[str],
               params: list[SamplingParams]) -> list[int]:
        """logits: [N, vocab] fp32, one row per request, in `request_ids` order."""
        out = logits.argmax(dim=-1).tolist()
        for row, (rid, sp) in enumerate(zip(request_ids, params)):
            if sp.temperature == 0:
                continue
            probs = self._probs(logits[row], sp)
            out[row] = int(torch.multinomial(probs, 1, generator=self._generator(rid, sp)))
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
        row = row.float().cpu() / sp.temperature  # [vocab]
        if 0 < sp.top_k < row.numel():
            kth = torch.topk(row, sp.top_k).values[-1]
            row = row.masked_fill(row < kth, float("-inf"))
        if sp.top_p < 1.0:
            sorted_logits, order = torch.sort(row, descending=True)
            cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
            drop = cum - torch.softmax(sorted_logits, dim=-1) >= sp.top_p  # keep the first
            row = row.scatter(0, order[drop], float("-inf"))
        return torch.softmax(row, dim=-1)

    def release(self, request_id: str) -> None:
        self._generators.pop(request_id, None)
