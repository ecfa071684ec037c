"""The index's prefix walk against a per-replica walk of sets, on fleets wider than one
mask word, with pending marks carrying device runs on, host runs after them, gaps
and prompts of hundreds of blocks."""

import random

import pytest

from router.core import index as index_module
from router.core.index import PrefixIndex, PrefixMatch
from tests.router.core.core_helpers import FakeClock

TTL_S = 2.0


def _chains(rng: random.Random, n: int) -> list[list[bytes]]:
    """Chains of hashes, most branching off an earlier one (shared prefixes)."""
    chains: list[list[bytes]] = []
    for _ in range(n):
        prefix = []
        if chains and rng.random() < 0.7:
            parent = rng.choice(chains)
            prefix = parent[:rng.randint(1, len(parent))]
        chains.append(prefix + [rng.randbytes(16) for _ in range(rng.randint(1, 90))])
    return chains


def _fleet(rng: random.Random, num_replicas: int):
    clock = FakeClock()
    index = PrefixIndex(pending_ttl_s=TTL_S, clock=clock)
    replicas = [f"r{i}" for i in range(num_replicas)]
    chains = _chains(rng, 60)
    for rid in replicas:
        for chain in rng.sample(chains, rng.randint(0, 6)):
            split = rng.randint(0, len(chain))
            index.add_blocks(rid, "device", chain[:split])
            index.add_blocks(rid, "host", chain[split:rng.randint(split, len(chain))])
            if rng.random() < 0.3:  # a gap in the device run, or device and host both
                index.remove_blocks(rid, "device", [rng.choice(chain)])
                index.add_blocks(rid, "host", rng.sample(chain, min(3, len(chain))))
    for _ in range(3 * num_replicas):  # marks: held by requests, or timed, some expired
        rid, chain = rng.choice(replicas), rng.choice(chains)
        start = rng.randint(0, len(chain) - 1)
        marked = chain[start:rng.randint(start + 1, len(chain))]
        index.mark_pending(rid, marked, held=rng.random() < 0.5)
        clock.advance(rng.random() * TTL_S / 4)
    return index, replicas, chains


def _expected(index: PrefixIndex, prompt: list[bytes], rid: str
              ) -> tuple[PrefixMatch, int]:
    """(the replica's match, its device run counting events only), the slow way."""
    on_device = set(index.blocks_of(rid, "device"))
    device = on_device | index.pending_blocks(rid)
    host = index.blocks_of(rid, "host")
    d = 0
    while d < len(prompt) and prompt[d] in device:
        d += 1
    t = d
    while t < len(prompt) and prompt[t] in host:
        t += 1
    confirmed = 0
    while confirmed < len(prompt) and prompt[confirmed] in on_device:
        confirmed += 1
    return PrefixMatch(d, t - d), confirmed


@pytest.mark.parametrize("short_up_to", [index_module.FEW_HASHES, 0, 1 << 20])
@pytest.mark.parametrize("every_replica", [False, True])
@pytest.mark.parametrize("num_replicas,seed", [(3, 0), (40, 1), (70, 2), (130, 3)])
def test_walk_equals_a_per_replica_walk(num_replicas, seed, every_replica, short_up_to,
                                        monkeypatch):
    """Candidates some of the replicas, or all of them (the walk then reads the masks as
    they are, where it masks out the others' bits otherwise). Short prompts are walked
    block by block (router.core.short_walk), the others as arrays: as the index splits
    them, then every prompt one way, then every prompt the other."""
    monkeypatch.setattr(index_module, "FEW_HASHES", short_up_to)
    rng = random.Random(seed)
    index, replicas, chains = _fleet(rng, num_replicas)
    index.check_invariants()
    num_carried = num_host = 0
    for _ in range(150):
        chain = rng.choice(chains)
        prompt = chain[:rng.randint(1, len(chain))] + [
            rng.randbytes(16) for _ in range(rng.choice([0, 1, 40]))]
        candidates = (rng.sample(replicas, len(replicas) if every_replica
                                 else rng.randint(1, len(replicas) - 1)) + ["unknown"])
        confirmed: dict[str, int] = {}
        got = index.match(prompt, candidates, confirmed)
        # one replica's match read alone (a decision's pick), as every one of them
        assert [got.get(rid) for rid in candidates] == [
            dict(got.items()).get(rid) for rid in candidates]
        want, want_confirmed = {}, {}
        for rid in candidates[:-1]:
            match, events_only = _expected(index, prompt, rid)
            if match.num_cached_blocks:
                want[rid] = match
            if events_only < match.num_device_blocks:
                want_confirmed[rid] = events_only
        assert got == want
        assert confirmed == want_confirmed
        num_carried += len(want_confirmed)
        num_host += sum(1 for m in want.values() if m.num_host_blocks)
    assert num_carried and num_host, "the fleet exercised no pending or host run"


def test_a_carried_run_that_ends_between_changed_blocks_goes_on_to_the_host_run():
    """Blocks 5..14 carry the same bits, so the walk visits 5, not 10, where the marks
    stop: the host run from 10 is taken up with block 5's bits."""
    index = PrefixIndex(pending_ttl_s=TTL_S, clock=FakeClock())
    prompt = [bytes([i]) * 16 for i in range(20)]
    index.add_blocks("a", "device", prompt[:5])
    index.add_blocks("a", "host", prompt[5:15])
    index.add_blocks("b", "device", prompt[:20])
    index.mark_pending("a", prompt[5:10], held=True)
    confirmed: dict[str, int] = {}
    assert index.match(prompt, ["a", "b"], confirmed) == {
        "a": PrefixMatch(10, 5), "b": PrefixMatch(20, 0)}
    assert confirmed == {"a": 5}
