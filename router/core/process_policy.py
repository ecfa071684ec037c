"""How a router process runs its interpreter: the collector and the GIL.

**The collector: freeze the start-up heap.** A router process (a Serve router replica, an
external gateway) holds some 100k GC-tracked objects from its start that live as long as it
does: Ray, Serve, FastAPI and pydantic state, imported modules, the router's configuration.
CPython's full (generation 2) collection walks every tracked object, about 80 ms of CPU at
that size (measured with benchmarks/gc_pause.py), and it runs inside whatever call allocates
when it triggers: a routing decision. `gc.freeze()` moves the objects alive now into a
permanent generation no collection walks, so a full collection costs what was allocated
since. The routing index itself is numpy arrays and bytes, which the collector never
tracks, so freezing before or after it is built makes no difference to it.

Garbage is collected first, so nothing collectable is frozen. A frozen object dropped later
is still freed by its reference count, but a reference cycle of frozen objects never is (a
start-up object is rarely dropped). Objects created later are collected as usual.

**The GIL: hand it over sooner.** A router process runs its requests on one thread and its
index mirror (poll replies applied, marks shared) on another: Serve's router thread, or the
prompt encoders' pool beside a gateway's loop. A thread waiting for the GIL gets it when the
holder blocks, or after the switch interval, 5 ms by default: a request's step that
wakes while a poll reply is being applied waits up to that, at every hand-over on its way.
At 0.5 ms a busy thread yields ten times as often, which costs it little (a switch is a few
microseconds) and caps what each wait adds. Measured with benchmarks/bench_overhead.py
(default path, two ingress routers), 8 runs each way alternating: medians 9.4 against 10.6 ms
added p50 (one request in flight), 0.44 against 0.40 of the engines' req/s, 0.85 against
0.66 of their stream tok/s, each within the spread of the runs on a shared 2-core box
(benchmarks/results/bench_overhead_gil_switch.txt).
"""

from __future__ import annotations

import gc
import sys

# the GIL's switch interval in a router process (CPython's default: 5 ms)
SWITCH_INTERVAL_S = 0.0005


def freeze_startup_heap() -> int:
    """Collects, then moves every object alive into the permanent generation. Call once,
    when the process has started and before it serves. Returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()


def prepare_router_process() -> None:
    """Both policies: freezes the start-up heap and sets the GIL switch interval (for every
    thread of the process) to SWITCH_INTERVAL_S. Call once, when the process has started
    and before it serves."""
    freeze_startup_heap()
    sys.setswitchinterval(SWITCH_INTERVAL_S)
