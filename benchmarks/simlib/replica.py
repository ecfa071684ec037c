"""One simulated engine replica: the engine's own core (worker/engine/core.py: scheduler, KV
manager, event log, host tier) with `worker.executor.sim.SimExecutor` (modelled step time,
deterministic tokens) in place of the forward pass. The discrete-event cluster
(benchmarks/simlib/cluster.py) drives it: `start_step` plans and costs a step,
`finish_step` applies it when the virtual clock reaches its end, as the live engine loop
(worker/engine/engine.py) does around its worker thread.
"""

from __future__ import annotations

from dataclasses import dataclass

from kv.events import EventLog
from kv.hashing import DEFAULT_BLOCK_SIZE
from kv.manager import KVCacheConfig
from protocol.engine import SampledToken
from worker.engine.core import EngineCore, StepPlan
from worker.engine.request import Request
from worker.engine.scheduler import SchedulerConfig
from worker.executor.sim import SimExecutor, get_preset


@dataclass(frozen=True)
class ReplicaConfig:
    num_blocks: int  # device KV blocks
    num_host_blocks: int = 0  # host tier blocks
    block_size: int = DEFAULT_BLOCK_SIZE
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    preset: str = "h100-llama3-8b"  # worker.executor.sim.PRESETS
    vocab_size: int = 32000
    # Every modelled step takes this many times the preset's time (a live engine on a busy
    # CPU runs slower than the hardware it models; sim_vs_live.py fits it to a live run).
    step_time_scale: float = 1.0

    def __post_init__(self):
        for name in ("num_blocks", "block_size", "max_num_seqs", "max_num_batched_tokens",
                     "vocab_size"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise ValueError(f"ReplicaConfig: {name} must be a positive integer, got "
                                 f"{getattr(self, name)!r}")
        if self.num_host_blocks < 0:
            raise ValueError(f"ReplicaConfig: num_host_blocks must be >= 0, got "
                             f"{self.num_host_blocks}")
        get_preset(self.preset)  # raises on an unknown preset
        if not self.step_time_scale > 0:
            raise ValueError(f"ReplicaConfig: step_time_scale must be > 0, got "
                             f"{self.step_time_scale!r}")

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens at most: the engine caps it at its KV capacity."""
        return self.num_blocks * self.block_size


class SimReplica:
    def __init__(self, replica_id: str, config: ReplicaConfig):
        self.replica_id = replica_id
        self.config = config
        self.core = EngineCore(
            KVCacheConfig(num_blocks=config.num_blocks, block_size=config.block_size,
                          num_host_blocks=config.num_host_blocks),
            SchedulerConfig(max_num_seqs=config.max_num_seqs,
                            max_num_batched_tokens=config.max_num_batched_tokens,
                            max_model_len=config.max_model_len),
            EventLog(replica_id, epoch=f"{replica_id}/sim"))
        self.executor = SimExecutor(config.preset, vocab_size=config.vocab_size,
                                    realtime=False, block_size=config.block_size)
        self.failed: list[Request] = []  # could never be scheduled; the cluster drains it
        self._plan: StepPlan | None = None
        self._sampled: dict[str, SampledToken] = {}
        self.num_steps = 0
        self.num_tokens_computed = 0  # prefill (uncached, recomputed too) + decode tokens
        self.busy_s = 0.0  # modelled time spent in steps

    @property
    def is_busy(self) -> bool:
        """A step is in flight (between start_step and finish_step)."""
        return self._plan is not None

    def add(self, req: Request) -> None:
        self.core.add(req)

    def start_step(self) -> float | None:
        """Plans the next step and returns its modelled duration; None when there is
        nothing to run. A request that can never fit fails, as in the live engine."""
        assert self._plan is None, "a step is already in flight"
        plan, unfit = self.core.plan_step()
        self.failed.extend(unfit)
        if plan is None:
            return None
        self._sampled = self.executor.execute(plan.step, plan.sampling)
        self._plan = plan
        duration_s = self.executor.last_step_time_s * self.config.step_time_scale
        self.num_steps += 1
        self.num_tokens_computed += plan.step.num_tokens
        self.busy_s += duration_s
        return duration_s

    def finish_step(self) -> list[Request]:
        """Applies the step in flight; returns the requests that got a token or finished."""
        plan, self._plan = self._plan, None
        assert plan is not None, "no step in flight"
        return self.core.update(plan.step, self._sampled)
