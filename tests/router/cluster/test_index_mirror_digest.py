"""The mirror's view digests: computed from the index's live sets, never by
copying and sorting a replica's whole hash set on the routing event loop."""

import os
import threading

from kv.events import Cursor, EventLog, contents_digest
from router.cluster.index_mirror import IndexMirror
from router.core.config import RouterConfig
from router.core.index import PrefixIndex
from router.core.router import Router


def test_digest_is_order_independent_and_matches_the_replica_side():
    hashes = [os.urandom(16) for _ in range(1000)]
    a = contents_digest(frozenset(hashes), frozenset(hashes[:10]))
    b = contents_digest(dict.fromkeys(reversed(hashes)).keys(), list(hashes[9::-1]))
    assert a == b
    assert a != contents_digest(frozenset(hashes[1:]), frozenset(hashes[:10]))
    assert a != contents_digest(frozenset(hashes[:10]), frozenset(hashes))  # media differ


def test_mirror_digests_without_copying_the_replica_sets(monkeypatch):
    def no_copy(*args, **kwargs):
        raise AssertionError("the mirror copied a replica's whole hash set")

    router = Router(RouterConfig(block_size=16))
    hashes = [os.urandom(16) for _ in range(5000)]
    log = EventLog("r0", epoch="e0")
    router.apply_snapshot(log.snapshot(hashes, hashes[:3]))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=object())
    mirror._cursors["r0"] = Cursor("e0", 0)
    monkeypatch.setattr(PrefixIndex, "blocks_of", no_copy)
    monkeypatch.setattr("builtins.sorted", no_copy)
    view = mirror._digests()
    monkeypatch.undo()
    assert view == {"r0": contents_digest(frozenset(hashes), frozenset(hashes[:3]))}


def make_stats(num_waiting: int = 0):
    from protocol.engine import EngineStats

    return EngineStats(num_running=1, num_waiting=num_waiting, num_queued_prefill_tokens=64,
                       num_blocks=8, num_used_blocks=1, num_cached_blocks=0,
                       num_pinned_blocks=0, num_free_blocks=7, num_host_blocks=0,
                       num_host_cached_blocks=0)


def test_a_replica_seen_dead_does_not_reappear_from_a_poll_that_crossed_its_death():
    """`forget_replica`, then a reply still carrying the replica re-added it."""
    from router.cluster.index_actor import PollReply

    router = Router(RouterConfig(block_size=16))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=object())
    log = EventLog("r0", epoch="e0")
    snap = log.snapshot([os.urandom(16) for _ in range(3)])
    mirror._apply(PollReply((snap,), (), {"r0": make_stats()}, ()))
    assert router.index.replica_ids == ["r0"] and router.loads._stats
    mirror.forget_replica("r0")
    later = log.snapshot([os.urandom(16) for _ in range(4)])
    mirror._apply(PollReply((later,), (), {"r0": make_stats()}, ()))
    assert router.index.replica_ids == [] and "r0" not in router.loads._stats
    assert "r0" not in mirror._cursors
    # The same id under a new epoch is a restarted replica: it is back.
    reborn = EventLog("r0", epoch="e1").snapshot([os.urandom(16)])
    mirror._apply(PollReply((reborn,), (), {}, ()))
    assert router.index.replica_ids == ["r0"]


def test_index_actor_restart_keeps_router_state_through_grace_then_resyncs():
    """A restarted actor lists every cursor as removed; the router held on."""
    from router.cluster.index_actor import PollReply
    from router.cluster.index_mirror import MirrorConfig

    router = Router(RouterConfig(block_size=16))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=object(),
                         config=MirrorConfig(restart_grace_s=60.0))
    logs = {rid: EventLog(rid, epoch="e0") for rid in ("r0", "r1")}
    held = {rid: [os.urandom(16) for _ in range(3)] for rid in logs}
    snaps = tuple(logs[rid].snapshot(held[rid]) for rid in logs)
    mirror._apply(PollReply(snaps, (), {"r0": make_stats()}, (), incarnation="actor-1"))
    router.loads.add("req-1", "r0", 100.0, 10)
    before = router.loads.load("r0")
    # The actor restarted: it knows nobody yet.
    mirror._apply(PollReply((), (), {}, ("r0", "r1"), incarnation="actor-2"))
    assert sorted(router.index.replica_ids) == ["r0", "r1"]
    assert router.index.blocks_of("r0") == frozenset(held["r0"])
    assert router.loads.load("r0") == before and mirror.replicas_in_grace == ["r0", "r1"]
    assert mirror._cursors == {}  # the next poll asks for snapshots
    # r0 publishes again (its contents moved on meanwhile): resynced from its snapshot.
    held["r0"] = held["r0"][1:] + [os.urandom(16)]
    mirror._apply(PollReply((logs["r0"].snapshot(held["r0"]),), (), {}, (),
                            incarnation="actor-2"))
    assert router.index.blocks_of("r0") == frozenset(held["r0"])
    assert mirror.replicas_in_grace == ["r1"]
    # r1 never comes back: removed once its grace ends.
    mirror._grace["r1"] = 0.0
    mirror._apply(PollReply((), (), {}, (), incarnation="actor-2"))
    assert router.index.replica_ids == ["r0"] and mirror.replicas_in_grace == []


def test_without_a_restart_removed_replicas_go_at_once():
    from router.cluster.index_actor import PollReply

    router = Router(RouterConfig(block_size=16))
    mirror = IndexMirror(router, "router-a", threading.Lock(), index=object())
    snap = EventLog("r0", epoch="e0").snapshot([os.urandom(16)])
    mirror._apply(PollReply((snap,), (), {}, (), incarnation="actor-1"))
    mirror._apply(PollReply((), (), {}, ("r0",), incarnation="actor-1"))
    assert router.index.replica_ids == []


def test_the_index_view_digests_from_its_arrays_as_the_replica_side_does_from_bytes(
        monkeypatch):
    from router.core.held_rows import HeldView

    def no_bytes(self):
        raise AssertionError("the digest made a bytes object per held hash")

    router = Router(RouterConfig(block_size=16))
    hashes = [os.urandom(16) for _ in range(300)]
    router.apply_snapshot(EventLog("r0", epoch="e0").snapshot(hashes[:200], hashes[200:]))
    router.index.remove_blocks("r0", "device", hashes[:50])
    view = router.index.held_view("r0", "device")
    assert view.key_words().shape == (150, 2)
    monkeypatch.setattr(HeldView, "__iter__", no_bytes)
    assert contents_digest(view, router.index.held_view("r0", "host")) == contents_digest(
        frozenset(hashes[50:200]), frozenset(hashes[200:]))
