"""The order a router lists the replicas in: from its own offset, over the live ones."""

from router.core.candidates import rotated, router_offset


def test_rotated_starts_at_the_offset_modulo_the_live_replicas_and_keeps_them_all():
    ids = ["a", "b", "c", "d"]
    assert rotated(ids, 0) == ids
    assert rotated(ids, 1) == ["b", "c", "d", "a"]
    assert rotated(ids, 6) == ["c", "d", "a", "b"]
    assert rotated(["a", "c", "d"], 6) == ["a", "c", "d"]  # "b" died: never listed
    assert rotated([], 3) == []


def test_a_routers_offset_is_a_stable_hash_of_its_id():
    assert router_offset("gw-1") == router_offset("gw-1")
    assert router_offset("gw-1") != router_offset("gw-2")
    assert router_offset("gw-1") == 0x524458491951E0AB
