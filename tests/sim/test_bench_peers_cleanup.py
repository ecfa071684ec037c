"""bench_peers' run of one cell stops every worker it started, whatever interrupts it."""

import argparse

import pytest

from benchmarks import bench_peers
from benchmarks.peers.workloads import PeerWorkload
from benchmarks.simlib import workloads as wl


def test_a_sigterm_while_workers_start_stops_the_ones_already_started(monkeypatch):
    started, stopped = [], []

    class Worker:
        def __init__(self, args):
            if len(started) == 2:
                raise SystemExit(143)  # bench_peers' SIGTERM handler, during the third start
            started.append(self)

    monkeypatch.setattr(bench_peers, "EngineWorker", Worker)
    monkeypatch.setattr(bench_peers, "stop_all", lambda workers: stopped.extend(workers))
    args = argparse.Namespace(sim_preset="h100-llama3-8b", workers=4, record_events=False,
                              gateways=1)
    spec = PeerWorkload("gsp", lambda seed: wl.generated_shared_prefix(1, 1, 16, 16, 1), 8,
                        None)
    with pytest.raises(SystemExit):
        bench_peers.run_cell(args, spec, "kvroute_events", 1, None, None)
    assert len(started) == 2 and stopped == started
