"""The hostile-tenant harness: three live fronts, a victim tenant that streams, a hostile
tenant that sends the worst single requests it can, and what that does to the victim and
to the router's state (benchmarks/bench_hostile.py, tests/reliability/test_hostile_tenant.py).
"""
