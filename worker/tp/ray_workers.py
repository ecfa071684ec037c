"""Tensor parallelism across Ray actors: rank 0 is the calling process (a Serve replica, in
bundle 0 of its placement group), ranks 1..tp-1 are actors placed in bundles 1..tp-1 of that
same placement group. Same protocol and surface as worker.tp.workers.TPWorkerGroup.

    placement group of the replica:  bundle 0          bundle 1        ...  bundle tp-1
                                      rank 0 (caller)   rank 1 actor         rank tp-1 actor
    rendezvous: tcp://<rank 0's node IP>:<free port>, gloo on CPU, NCCL on GPU

Each rank actor asks for exactly its bundle's CPUs and GPUs, so Ray gives it its own GPU
(CUDA_VISIBLE_DEVICES) and every rank, rank 0 included, runs on its process's cuda:0.

A rank that dies or hangs (gloo cases measured on CPU):
- Ray already reports it dead (its `serve` call failed): the next `send` raises
  RuntimeError "TP group is broken: rank r: ActorDiedError: ..." before any collective;
- Ray has not noticed yet: the step's broadcast may still go out (the socket buffers it),
  then the forward's first collective fails at once with gloo's "Connection closed by
  peer"; when the broadcast itself fails, `send` names the rank Ray reports gone (waiting
  up to _DIAGNOSIS_WAIT_S for Ray to notice);
- alive but stuck: rank 0's collective fails after dist_timeout_s (gloo's timeout);
- NCCL: a collective inside the forward cannot be interrupted; torch's watchdog tears down
  rank 0's process after dist_timeout_s (TORCH_NCCL_ASYNC_ERROR_HANDLING, default 3), Serve
  replaces the replica and Ray kills its rank actors (their owner died).
After any of these the group is broken for good: ModelExecutor.shutdown() still kills the
actors and leaves the group (logging, not raising), and the replica has to be rebuilt.
"""

from __future__ import annotations

import logging

import ray
import torch
import torch.distributed as dist
from ray.util.placement_group import PlacementGroup, get_current_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from worker.engine.step import StepInput
from worker.ports import free_port
from worker.tp.workers import RankSpec, Shutdown, join_group, rank_main

log = logging.getLogger(__name__)

# How long a failed broadcast waits for Ray to say which rank is gone: a diagnosis only (the
# collective already failed), so kept short; a stuck rank never shows up here.
_DIAGNOSIS_WAIT_S = 2.0


class _ActorRankSpec(RankSpec):
    """A rank actor sees only the GPU of its bundle: rank r runs on cuda:0, not cuda:r."""

    def torch_device(self, rank: int) -> torch.device:
        return torch.device("cuda", 0) if self.config.device == "cuda" else torch.device("cpu")


@ray.remote(max_restarts=0)
class RankActor:
    """TP rank `rank` of one replica: builds its runner and follows rank 0's steps."""

    def __init__(self, spec: _ActorRankSpec, rank: int) -> None:
        self.spec = spec
        self.rank = rank

    def ready(self) -> str:
        """Placed and constructed; returns this actor's node IP."""
        if self.spec.config.device == "cuda" and not torch.cuda.is_available():
            raise RuntimeError("no CUDA device visible: its bundle must hold a GPU")
        return ray.util.get_node_ip_address()

    def serve(self) -> None:
        """Join the group, build the runner, run steps until Shutdown (the rank's life)."""
        rank_main(self.spec, self.rank)


def current_placement_group(tp: int, device: str) -> PlacementGroup:
    """The caller's placement group, checked to hold a bundle per rank."""
    pg = get_current_placement_group()
    if pg is None:
        raise RuntimeError(
            "TP launcher 'ray' must run inside a Ray actor scheduled in a placement group "
            f"with {tp} bundles (a Serve replica with placement_group_bundles), rank 0 "
            "in bundle 0; this process belongs to no placement group"
        )
    bundles = pg.bundle_specs
    if len(bundles) < tp:
        raise RuntimeError(
            f"tp {tp} needs a bundle per rank; the placement group has "
            f"{len(bundles)}: {bundles}"
        )
    if device == "cuda":
        short = [r for r in range(tp) if bundles[r].get("GPU", 0) < 1]
        if short:
            raise RuntimeError(
                f"device 'cuda' needs one whole GPU per rank; bundles {short} of {bundles} "
                "hold less"
            )
    return pg


class RayTPWorkerGroup:
    """Starts ranks 1..tp-1 as Ray actors in the caller's placement group and makes the
    calling process rank 0.

    Args:
        spec: as for TPWorkerGroup; its init_method is replaced by this node's IP and a
            free port, and spec.config.dist_timeout_s also bounds how long the actors may
            take to be placed and constructed.

    Raises RuntimeError naming the rank when a rank actor cannot start or join.
    """

    def __init__(self, spec: RankSpec) -> None:
        pg = current_placement_group(spec.config.tp, spec.config.device)
        ip = ray.util.get_node_ip_address()
        spec = _ActorRankSpec(spec.config, init_method=f"tcp://{ip}:{free_port(ip)}")
        self.actors = [
            RankActor.options(
                num_cpus=pg.bundle_specs[rank].get("CPU", 0),
                num_gpus=pg.bundle_specs[rank].get("GPU", 0),
                scheduling_strategy=PlacementGroupSchedulingStrategy(pg, rank),
            ).remote(spec, rank)
            for rank in range(1, spec.config.tp)
        ]
        self.serve_refs: list[ray.ObjectRef] = []  # ranks 1..tp-1's `serve` calls
        self.running = False
        try:
            self._wait_ready(spec.config.dist_timeout_s)
            self.serve_refs = [actor.serve.remote() for actor in self.actors]
            try:
                self.comm = join_group(spec, 0)
            except Exception as exc:
                raise RuntimeError(
                    f"TP rank 0 could not join the group at {spec.init_method}: "
                    f"{self._failed_ranks(_DIAGNOSIS_WAIT_S) or exc}"
                ) from exc
        except BaseException:
            self._kill()
            raise
        self.running = True

    def send(self, message: StepInput | Shutdown) -> None:
        """Broadcast the message to every rank; RuntimeError naming the rank when one is
        gone (checked before, and after a failed broadcast)."""
        gone = self._failed_ranks(0.0)
        if gone:
            raise RuntimeError(f"TP group is broken: {gone}")
        try:
            self.comm.broadcast_object(message)
        except Exception as exc:
            gone = self._failed_ranks(_DIAGNOSIS_WAIT_S) or "every rank actor is alive"
            raise RuntimeError(f"TP broadcast failed ({exc}): {gone}") from exc

    def stop(self, timeout_s: float = 30.0) -> None:
        """Tell the ranks to exit, wait for them, leave the group. Idempotent; a broken
        group is logged, not raised (its error was raised by the step that found it)."""
        if not self.running:
            return
        self.running = False
        try:
            self.send(Shutdown())
            ray.wait(self.serve_refs, num_returns=len(self.serve_refs), timeout=timeout_s)
        except Exception as exc:
            log.warning("stopping a broken TP group: %s", exc)
        finally:
            self._kill()
            dist.destroy_process_group()

    def leave_after_failed_start(self) -> None:
        """The ranks' runners failed and they left their loops: reap them."""
        self.running = False
        ray.wait(self.serve_refs, num_returns=len(self.serve_refs), timeout=30.0)
        self._kill()
        dist.destroy_process_group()

    def _wait_ready(self, timeout_s: float) -> None:
        refs = [actor.ready.remote() for actor in self.actors]
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=timeout_s)
        problems, node_ips = [], []
        for rank, ref in enumerate(refs, start=1):
            if ref not in done:
                problems.append(f"rank {rank}: not placed or started within {timeout_s} s")
                continue
            try:
                node_ips.append(ray.get(ref))
            except Exception as exc:
                problems.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        if problems:
            raise RuntimeError("TP rank actors failed to start; " + "; ".join(problems))
        log.info("TP ranks 1..%d placed on nodes %s", len(refs), node_ips)

    def _failed_ranks(self, timeout_s: float) -> str:
        """'rank r: error' for each rank actor whose `serve` ended ('' when none did
        within timeout_s): a dead actor, or a rank whose loop raised."""
        if not self.serve_refs:
            return ""
        refs = self.serve_refs
        done, _ = ray.wait(refs, num_returns=1, timeout=timeout_s, fetch_local=False)
        if not done:
            return ""
        done, _ = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
        problems = []
        for rank, ref in enumerate(refs, start=1):
            if ref in done:
                try:
                    ray.get(ref)
                    problems.append(f"rank {rank}: left its step loop")
                except Exception as exc:
                    problems.append(f"rank {rank}: {type(exc).__name__}: {exc}")
        return "; ".join(problems)

    def _kill(self) -> None:
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
