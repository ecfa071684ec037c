"""The cyclic collector in a serving process: freeze the start-up heap.

A router process (a Serve router replica, an external gateway) holds some 100k GC-tracked
objects from its start that live as long as it does: Ray, Serve, FastAPI and pydantic
state, imported modules, the router's configuration. CPython's full (generation 2)
collection walks every tracked object, about 80 ms of CPU at that size (measured with
benchmarks/gc_pause.py), and it runs inside whatever call allocates when it triggers: a
routing decision. `gc.freeze()` moves the objects alive now into a permanent generation no
collection walks, so a full collection costs what was allocated since. The routing index
itself is numpy arrays and bytes, which the collector never tracks, so freezing before or
after it is built makes no difference to it.

Garbage is collected first, so nothing collectable is frozen. A frozen object dropped later
is still freed by its reference count, but a reference cycle of frozen objects never is (a
start-up object is rarely dropped). Objects created later are collected as usual.
"""

from __future__ import annotations

import gc


def freeze_startup_heap() -> int:
    """Collects, then moves every object alive into the permanent generation. Call once,
    when the process has started and before it serves. Returns how many are frozen."""
    gc.collect()
    gc.freeze()
    return gc.get_freeze_count()
