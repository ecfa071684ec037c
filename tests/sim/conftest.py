"""Small simulated clusters for the tests of benchmarks/simlib."""

from benchmarks.simlib.cluster import ClusterConfig, ClusterSim
from benchmarks.simlib.replica import ReplicaConfig
from router.core.config import RouterConfig


def make_sim(workload, num_replicas=2, policy="cache_aware", num_blocks=256, host_blocks=0,
             preset="tiny", approximate=False, seed=0, **router_kw):
    replica = ReplicaConfig(num_blocks=num_blocks, num_host_blocks=host_blocks,
                            max_num_seqs=16, max_num_batched_tokens=512, preset=preset)
    router = RouterConfig(policy=policy, approximate=approximate,
                          approx_capacity_blocks=num_blocks + host_blocks, **router_kw)
    return ClusterSim(ClusterConfig(num_replicas, replica, router, seed=seed), workload)
