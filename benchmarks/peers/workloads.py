"""bench_peers.py's workloads, sized for a 2-core box (every size is a flag of the bench).

Each is one of benchmarks/simlib's generators with the capacity a worker gets, the
requests in flight (None: open loop, each at its arrival time) and the sim preset:
- gsp: SGLang's generated-shared-prefix, 32 groups x 8 prompts, 1,024-token system
  prompts, 64-token questions, 32 tokens out, 32 in flight, 768 blocks a worker (the 32
  prefixes fill 2/3 of the 4 workers' pools).
- mooncake: the Mooncake FAST'25 synthetic trace (/work/shared/workloads), one prefix
  family in 32 (the requests whose first block id is 1 mod 32: 132 requests, 61% of their
  tokens shareable, where any 120 consecutive requests share 0-22%), its 17 minutes sped up
  20x, 6,000 blocks a worker (the families' 52,700 distinct blocks fill 2.2 clusters).
- multi_turn: SGLang's bench_multiturn shape, 48 clients x 4 rounds, 512 new tokens a
  round, 64 out, the history resent each round.
- conversation: the simulator's long chats (benchmarks/simlib/conversation.py), open loop,
  8,000 blocks a worker, think times and answers shortened so a run takes about a minute.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from benchmarks.simlib import workloads as wl
from benchmarks.simlib.conversation import conversation

WORKLOADS = ("gsp", "mooncake", "multi_turn", "conversation")
MOONCAKE_TRACE = Path("/work/shared/workloads/mooncake_synthetic_trace.jsonl")


@dataclass(frozen=True)
class PeerWorkload:
    name: str
    build: Callable[[int], wl.Workload]  # seed -> the workload
    num_blocks: int  # KV blocks a worker
    max_concurrency: int | None  # None: open loop

    def __post_init__(self):
        if self.num_blocks < 1:
            raise ValueError(f"{self.name}: num_blocks must be >= 1, got {self.num_blocks}")


def peer_workload(name: str, args) -> PeerWorkload:
    """The workload `name` at the sizes `args` (bench_peers.py's flags) give."""
    if name == "gsp":
        return PeerWorkload(name, lambda seed: wl.generated_shared_prefix(
            32, 8, 1024, 64, 32, seed=seed), args.gsp_blocks, 32)
    if name == "mooncake":
        # one trace: the seed only draws each block's tokens
        return PeerWorkload(name, lambda seed: wl.mooncake(
            args.mooncake_trace, args.mooncake_time_scale, None, args.mooncake_families, 1),
            args.mooncake_blocks, None)
    if name == "multi_turn":
        return PeerWorkload(name, lambda seed: wl.multi_turn(
            args.multi_turn_clients, 4, 512, 64, rate_qps=16.0, seed=seed),
            args.multi_turn_blocks, None)
    if name == "conversation":
        return PeerWorkload(name, lambda seed: conversation(
            rate_qps=args.conversation_requests / args.conversation_duration_s,
            duration_s=args.conversation_duration_s, think_mean_s=args.conversation_think_s,
            output_mean_tokens=args.conversation_output_tokens, seed=seed),
            args.conversation_blocks, None)
    raise ValueError(f"unknown workload {name!r}; choose from {WORKLOADS}")


def add_workload_flags(p) -> None:
    p.add_argument("--gsp-blocks", type=int, default=768)
    p.add_argument("--mooncake-trace", type=Path, default=MOONCAKE_TRACE)
    p.add_argument("--mooncake-families", type=int, default=32,
                   help="keep the prefix families whose first block id is 1 modulo this")
    p.add_argument("--mooncake-time-scale", type=float, default=20.0,
                   help="arrivals divided by this")
    p.add_argument("--mooncake-blocks", type=int, default=6000)
    p.add_argument("--multi-turn-clients", type=int, default=48)
    p.add_argument("--multi-turn-blocks", type=int, default=1536)
    p.add_argument("--conversation-requests", type=int, default=400)
    p.add_argument("--conversation-duration-s", type=float, default=25.0,
                   help="sessions start within this")
    p.add_argument("--conversation-think-s", type=float, default=1.0, help="mean think time")
    p.add_argument("--conversation-output-tokens", type=float, default=64.0,
                   help="mean answer length")
    p.add_argument("--conversation-blocks", type=int, default=8000)
