"""bench_peers.py's parts: the routers under test, the workloads, the bound."""
