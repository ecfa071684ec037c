"""TP 2 with rank 1 a Ray actor (tp_launcher "ray"), laid out as in Serve: rank 0 is an actor in
bundle 0 of a two-bundle placement group, rank 1 goes to bundle 1. It computes what TP 1
computes, and once rank 1 is dead the next step fails with an error naming it."""

from __future__ import annotations

import dataclasses

import pytest
import ray
import torch
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from tests.worker.model.model_harness import CONFIGS, prompt, seq, step
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_executor import ModelExecutor
from worker.model.random_checkpoint import write_random_checkpoint

pytestmark = pytest.mark.slow

CALL_TIMEOUT_S = 240.0  # Ray calls on a loaded 2-core machine; far above the usual


def prefill_then_decode(executor: ModelExecutor, prompts: list[list[int]]):
    """One prefill step of both prompts, then one decode step; tokens and logits."""
    blocks = [[0, 1, 2, 3], [4, 5, 6, 7]]  # block_size 4: room for 16 tokens each
    first = executor.execute(step(*(seq(str(i), p, 0, blocks[i]) for i, p in enumerate(prompts))))
    tokens = first.argmax(dim=-1).tolist()
    second = executor.execute(
        step(*(seq(str(i), [tokens[i]], len(p), blocks[i]) for i, p in enumerate(prompts)))
    )
    return tokens + second.argmax(dim=-1).tolist(), torch.cat([first, second])


@ray.remote(num_cpus=1)
class ReplicaRankZero:
    """Stands in for a Serve replica: rank 0, running in bundle 0."""

    def run(self, config: ModelExecutorConfig, prompts: list[list[int]]):
        """Tokens and logits of prefill_then_decode, then the error of a step taken after
        rank 1 died."""
        executor = ModelExecutor(config)
        try:
            tokens, logits = prefill_then_decode(executor, prompts)
            workers = executor._workers
            ray.kill(workers.actors[0])
            # Synchronise on Ray having seen rank 1 die: its serve call fails.
            with pytest.raises(ray.exceptions.RayActorError):
                ray.get(workers.serve_refs[0], timeout=CALL_TIMEOUT_S)
            with pytest.raises(RuntimeError) as died:
                executor.execute(step(seq("0", [tokens[2]], len(prompts[0]) + 1, [0, 1, 2, 3])))
            return tokens, logits, str(died.value)
        finally:
            executor.shutdown()


@pytest.fixture(scope="module")
def ray_cpus():
    if ray.is_initialized():  # another module's Ray: start our own, sized for this test
        ray.shutdown()
    ray.init(num_cpus=4, include_dashboard=False)
    yield
    ray.shutdown()


def test_ray_tp2_matches_tp1_and_names_a_dead_rank(ray_cpus, tmp_path):
    path = write_random_checkpoint(tmp_path / "m", dict(CONFIGS["llama"], vocab_size=301), seed=3)
    prompts = [prompt(9, seed=1), prompt(6, seed=2)]
    config = ModelExecutorConfig(model_dir=path, num_blocks=8, block_size=4, dist_timeout_s=60)
    pg = placement_group([{"CPU": 1}, {"CPU": 1}])
    try:
        rank_zero = ReplicaRankZero.options(
            scheduling_strategy=PlacementGroupSchedulingStrategy(pg, 0)
        ).remote()
        ray_config = dataclasses.replace(config, tp=2, tp_launcher="ray")
        result = rank_zero.run.remote(ray_config, prompts)
        with ModelExecutor(config) as executor:  # TP 1 here while Ray starts the ranks
            tokens_1, logits_1 = prefill_then_decode(executor, prompts)
        tokens_2, logits_2, died = ray.get(result, timeout=CALL_TIMEOUT_S)
    finally:
        remove_placement_group(pg)

    assert tokens_2 == tokens_1
    torch.testing.assert_close(logits_2, logits_1, atol=1e-4, rtol=0)
    assert died.startswith("TP group is broken: rank 1: ActorDiedError: "), died
