"""The pause between a mirror's polls scales with the fleet: a poll costs the index actor
O(replicas), and with a few a pause only delays the marks other routers share."""

import threading

from kv.events import Cursor
from router.cluster.index_mirror import IndexMirror, MirrorConfig
from router.core.config import RouterConfig
from router.core.router import Router


def test_the_pause_scales_with_the_replicas_up_to_the_full_pace():
    mirror = IndexMirror(Router(RouterConfig(block_size=16)), "router-a", threading.Lock(),
                         index=object(),
                         config=MirrorConfig(poll_interval_s=0.05, pace_full_replicas=64))
    assert mirror.pace_s() == 0.0  # nothing listed yet
    for i in range(2):
        mirror._cursors[f"r{i}"] = Cursor("e0", 0)
    assert mirror.pace_s() == 0.05 * 2 / 64
    for i in range(2, 256):
        mirror._cursors[f"r{i}"] = Cursor("e0", 0)
    assert mirror.pace_s() == 0.05
