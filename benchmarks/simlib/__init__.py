"""Pieces of the routing simulator (benchmarks/sim_routing.py) and the HTTP load generator
(benchmarks/bench_serving.py): workloads, simulated replicas over the real scheduler and KV
manager, the discrete-event cluster around the real router, and the reports.
"""
