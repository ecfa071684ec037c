"""Tensor parallelism across local processes: rank 0 is the caller's process, ranks
1..tp-1 are spawned here and follow it step by step.

    rank 0 (engine process)                 rank r (spawned)
    init process group  <---------------->  init process group
    load shard, all-gather "ready"  <---->  load shard, all-gather "ready" (or its error)
    broadcast StepInput  ---------------->  receive StepInput
    execute (collectives inside)  <------>  execute (collectives inside)
    broadcast Shutdown  ----------------->  leave the loop, destroy the group

Messages are typed dataclasses (StepInput, Shutdown), never method names.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from worker.engine.step import StepInput
from worker.executor.config import ModelExecutorConfig
from worker.executor.model_runner import ModelRunner
from worker.tp.communicator import TPCommunicator


@dataclass(frozen=True)
class Shutdown:
    """Rank 0 tells the other ranks to leave their step loop."""


@dataclass(frozen=True)
class RankSpec:
    """Everything a rank needs to build its runner (sent to spawned ranks)."""

    config: ModelExecutorConfig
    init_method: str  # tcp://127.0.0.1:<free port>

    def torch_device(self, rank: int) -> torch.device:
        """Local ranks share this host's GPUs: rank r runs on cuda:r."""
        return torch.device("cuda", rank) if self.config.device == "cuda" else torch.device("cpu")


def join_group(spec: RankSpec, rank: int) -> TPCommunicator:
    """Join the replica's process group (the default group of this process)."""
    if dist.is_initialized():
        raise RuntimeError("this process already belongs to a torch.distributed group")
    backend = "nccl" if spec.config.device == "cuda" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(spec.torch_device(rank))
    dist.init_process_group(
        backend,
        init_method=spec.init_method,
        rank=rank,
        world_size=spec.config.tp,
        timeout=timedelta(seconds=spec.config.dist_timeout_s),
    )
    group = dist.group.WORLD
    # Step metadata travels over gloo even when tensors use NCCL.
    cpu_group = dist.new_group(backend="gloo") if backend == "nccl" else group
    return TPCommunicator(rank, spec.config.tp, group, cpu_group)


def build_runner(spec: RankSpec, comm: TPCommunicator) -> ModelRunner:
    """Build this rank's runner, then agree with every rank that all of them succeeded.

    Raises RuntimeError naming each rank that failed (on every rank).
    """
    runner, error = None, ""
    try:
        runner = ModelRunner(spec.config, comm, spec.torch_device(comm.rank))
    except Exception as exc:  # reported to rank 0 below instead of hanging it
        error = f"{type(exc).__name__}: {exc}"
    errors: list[str] = [""] * spec.config.tp
    dist.all_gather_object(errors, error, group=comm.cpu_group)
    failed = [f"rank {r}: {e}" for r, e in enumerate(errors) if e]
    if failed or runner is None:
        raise RuntimeError("model runner failed to start; " + "; ".join(failed))
    return runner


def rank_main(spec: RankSpec, rank: int) -> None:
    """Entry point of a spawned rank: follow rank 0's steps until Shutdown."""
    comm = join_group(spec, rank)
    try:
        runner = build_runner(spec, comm)
        while True:
            message = comm.broadcast_object(None)
            if isinstance(message, Shutdown):
                break
            assert isinstance(message, StepInput), type(message)
            runner.execute(message)
    finally:
        dist.destroy_process_group()


class TPWorkerGroup:
    """Spawns ranks 1..tp-1 and makes the calling process rank 0."""

    def __init__(self, spec: RankSpec) -> None:
        ctx = mp.get_context("spawn")
        self.processes = [
            ctx.Process(target=rank_main, args=(spec, rank), daemon=True, name=f"tp-rank-{rank}")
            for rank in range(1, spec.config.tp)
        ]
        for p in self.processes:
            p.start()
        try:
            self.comm = join_group(spec, 0)
        except BaseException:
            self._terminate()
            raise
        self.running = True

    def send(self, message: StepInput | Shutdown) -> None:
        self.comm.broadcast_object(message)

    def stop(self, timeout_s: float = 30.0) -> None:
        """Tell the ranks to exit, wait for them, leave the group. Idempotent."""
        if not self.running:
            return
        self.running = False
        try:
            self.send(Shutdown())
        finally:
            for p in self.processes:
                p.join(timeout_s)
            self._terminate()
            dist.destroy_process_group()

    def leave_after_failed_start(self) -> None:
        """The ranks already exited (their runners failed): just reap them."""
        self.running = False
        for p in self.processes:
            p.join(30.0)
        self._terminate()
        dist.destroy_process_group()

    def _terminate(self) -> None:
        for p in self.processes:
            if p.is_alive():
                p.terminate()
                p.join(5.0)
