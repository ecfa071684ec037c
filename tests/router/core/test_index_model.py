"""Random event streams, losses, restarts, pending marks and removals against a naive model.

The model keeps, per replica, the dict-of-sets contents the index should mirror: the
producer's true contents as of the last event the index applied (the test records the true
contents at every drained batch's end). Pending marks are a dict (hash, replica) ->
expiry, or minus the number of outstanding requests holding the mark. After every step
the index's invariants hold and its prefix matches equal the model's, computed the slow
way.
"""

import copy

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, EventLog
from router.core.index import PrefixIndex, PrefixMatch
from tests.router.core.core_helpers import FakeClock, h

REPLICAS = ["a", "b", "c"]
MEDIA = ["device", "host"]
UNIVERSE = [h(i) for i in range(10)]
PROMPTS = [UNIVERSE[:6], UNIVERSE[:2] + UNIVERSE[6:9], [UNIVERSE[9], UNIVERSE[0]], UNIVERSE]
TTL_S = 4.0

hash_lists = st.lists(st.sampled_from(UNIVERSE), min_size=1, max_size=5, unique=True)


def empty():
    return {m: set() for m in MEDIA}


class IndexMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.clock = FakeClock()
        self.index = PrefixIndex(pending_ttl_s=TTL_S, clock=self.clock)
        self.truth = {r: empty() for r in REPLICAS}
        self.logs = {r: EventLog(r, epoch=f"{r}-0") for r in REPLICAS}
        self.events = {f"{r}-0": [] for r in REPLICAS}  # epoch -> events by sequence number
        self.truth_at = {}  # (epoch, next_seq) -> true contents after that event
        self.view = {r: empty() for r in REPLICAS}  # what the index should hold
        self.pending = {}  # (hash, replica) -> expires_at
        self.requests = []  # outstanding (replica, held hashes)
        self.held = []  # drained batches not delivered yet
        self.num_epochs = 1

    def _append(self, r, event):
        self.logs[r].append(event)
        self.events[self.logs[r].epoch].append(event)

    @rule(r=st.sampled_from(REPLICAS), medium=st.sampled_from(MEDIA), hashes=hash_lists)
    def store(self, r, medium, hashes):
        self._append(r, BlockStored(tuple(hashes), None, medium))
        self.truth[r][medium].update(hashes)

    @rule(r=st.sampled_from(REPLICAS), medium=st.sampled_from(MEDIA), hashes=hash_lists)
    def remove(self, r, medium, hashes):
        self._append(r, BlockRemoved(tuple(hashes), medium))
        self.truth[r][medium].difference_update(hashes)

    @rule(r=st.sampled_from(REPLICAS))
    def clear(self, r):
        self._append(r, AllBlocksCleared())
        self.truth[r] = empty()

    @rule(r=st.sampled_from(REPLICAS))
    def restart(self, r):
        self.logs[r] = EventLog(r, epoch=f"{r}-{self.num_epochs}")
        self.num_epochs += 1
        self.events[self.logs[r].epoch] = []
        self.truth[r] = empty()

    @rule(r=st.sampled_from(REPLICAS),
          fate=st.sampled_from(["deliver", "deliver", "deliver", "drop", "hold"]))
    def drain(self, r, fate):
        batch = self.logs[r].drain()
        self.truth_at[(batch.epoch, batch.next_seq)] = copy.deepcopy(self.truth[r])
        if fate == "deliver":
            self._deliver(batch)
        elif fate == "hold":
            self.held.append(batch)

    @precondition(lambda self: self.held)
    @rule(data=st.data())
    def deliver_held(self, data):
        self._deliver(self.held.pop(data.draw(st.integers(0, len(self.held) - 1))))

    @rule()
    def drain_all_together(self):
        """Every replica's batch in one `apply_batches` (a mirror's poll)."""
        batches = [self.logs[r].drain() for r in REPLICAS]
        for batch in batches:
            self.truth_at[(batch.epoch, batch.next_seq)] = copy.deepcopy(
                self.truth[batch.replica_id])
        old_seqs = [self.index.next_seq(b.replica_id) for b in batches]
        needs_snapshot = self.index.apply_batches(batches)
        for batch, old_seq, needs in zip(batches, old_seqs, needs_snapshot):
            self._deliver(batch, (old_seq, needs))

    def _deliver(self, batch, applied=None):
        """`applied`: (the replica's next_seq before, what `apply_batches` answered) when
        the batch was applied already."""
        r = batch.replica_id
        old_seq, needs_snapshot = applied or (self.index.next_seq(r), None)
        if needs_snapshot is None:
            needs_snapshot = self.index.apply_batch(batch)
        if needs_snapshot:
            log = self.logs[r]
            self.index.apply_snapshot(log.snapshot(self.truth[r]["device"],
                                                   self.truth[r]["host"]))
            self.view[r] = copy.deepcopy(self.truth[r])
            self._confirm(r, self.truth[r]["device"])
            return
        new_seq = self.index.next_seq(r)
        if new_seq == old_seq:
            return  # an old duplicate
        self.view[r] = copy.deepcopy(self.truth_at[(batch.epoch, new_seq)])
        for event in self.events[batch.epoch][old_seq:new_seq]:
            if isinstance(event, BlockStored) and event.medium == "device":
                self._confirm(r, event.block_hashes)

    def _confirm(self, r, hashes):
        for x in hashes:
            self.pending.pop((x, r), None)

    @rule(r=st.sampled_from(REPLICAS), prompt=st.sampled_from(PROMPTS),
          start=st.integers(0, 3))
    def mark_pending(self, r, prompt, start):
        self.index.mark_pending(r, prompt[start:])
        for x in prompt[start:]:
            if self.pending.get((x, r), 0) >= 0:  # a held mark stays held
                self.pending[(x, r)] = self.clock.now + TTL_S

    @rule(r=st.sampled_from(REPLICAS), prompt=st.sampled_from(PROMPTS),
          start=st.integers(0, 3))
    def hold_pending(self, r, prompt, start):
        hashes = prompt[start:]
        self.index.mark_pending(r, hashes, held=True)
        self.requests.append((r, hashes))
        for x in hashes:
            self.pending[(x, r)] = min(self.pending.get((x, r), 0), 0) - 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def release_pending(self, data):
        r, hashes = self.requests.pop(data.draw(st.integers(0, len(self.requests) - 1)))
        self.index.release_pending(r, hashes)
        for x in hashes:
            holders = self.pending.get((x, r))
            if holders is None or holders > 0:
                continue  # confirmed since, or timed again after the last holder left
            self.pending[(x, r)] = holders + 1 if holders < -1 else self.clock.now + TTL_S

    @rule(seconds=st.sampled_from([1.0, 4.0]))
    def advance(self, seconds):
        self.clock.advance(seconds)

    @rule(r=st.sampled_from(REPLICAS))
    def remove_replica(self, r):
        self.index.remove_replica(r)
        self.view[r] = empty()
        self.pending = {k: t for k, t in self.pending.items() if k[1] != r}
        self.requests = [(rr, hashes) for rr, hashes in self.requests if rr != r]

    def _naive_match(self, prompt, r):
        device = self.view[r]["device"] | {
            x for (x, rr), t in self.pending.items() if rr == r and (t > self.clock.now or t < 0)}
        num_device = 0
        while num_device < len(prompt) and prompt[num_device] in device:
            num_device += 1
        end = num_device
        while end < len(prompt) and prompt[end] in self.view[r]["host"]:
            end += 1
        return PrefixMatch(num_device, end - num_device)

    @invariant()
    def index_equals_model(self):
        self.index.check_invariants()
        for r in REPLICAS:
            for medium in MEDIA:
                assert self.index.blocks_of(r, medium) == self.view[r][medium], (r, medium)
        for prompt in PROMPTS:
            want = {r: m for r in REPLICAS
                    if (m := self._naive_match(prompt, r)).num_cached_blocks}
            confirmed: dict[str, int] = {}
            assert self.index.match(prompt, REPLICAS, confirmed) == want
            for r, m in want.items():  # the walk's confirmed runs equal a walk of events only
                got = confirmed.get(r, m.num_device_blocks)
                assert got == self.index.num_confirmed_device_blocks(r, prompt), (r, prompt)
                num_events_only = 0
                while (num_events_only < len(prompt)
                       and prompt[num_events_only] in self.view[r]["device"]):
                    num_events_only += 1
                assert got == min(num_events_only, m.num_device_blocks), (r, prompt)
        alive = sum(1 for t in self.pending.values() if t > self.clock.now or t < 0)
        assert len(self.index.pending) == alive


TestIndexMachine = IndexMachine.TestCase
TestIndexMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)
