"""Random allocate / append / free / pin / evict sequences against the real manager.

Alongside the manager, the test keeps a model of physical memory: what tokens each block
id holds, written when a request computes its blocks. Every cache hit must return blocks
whose physical contents equal the request's own tokens (an eviction or table bug that
hands out a reused block shows up here), and the invariants hold after every step.
"""

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.kv.conftest import BLOCK_SIZE, hashes, make_manager

PREFIXES = [[1] * 8, [2] * 12, [1] * 8 + [3] * 4, []]


class ManagerMachine(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.mgr = make_manager(10, num_host_blocks=6, pin_budget_blocks=3)
        self.memory: dict[int, list[int]] = {}  # block_id -> tokens written there
        self.host_memory: dict[int, list[int]] = {}
        self.reqs: dict[str, list[int]] = {}  # request -> tokens
        self.n = 0

    def _write(self, rid, start_token, end_token):
        """The request computes tokens [start, end): write them into their blocks."""
        tokens, ids = self.reqs[rid], self.mgr.block_ids(rid)
        for pos in range(start_token, end_token):
            blk, off = divmod(pos, BLOCK_SIZE)
            self.memory.setdefault(ids[blk], [None] * BLOCK_SIZE)[off] = tokens[pos]

    def _apply_copies(self):
        plan = self.mgr.take_copy_plan()
        for block_id, slot in plan.swap_out:
            self.host_memory[slot] = list(self.memory[block_id])
        for slot, block_id in plan.swap_in:
            self.memory[block_id] = list(self.host_memory[slot])

    @rule(prefix=st.sampled_from(PREFIXES), suffix=st.lists(st.integers(0, 3), max_size=9))
    def admit(self, prefix, suffix):
        tokens = prefix + suffix
        if not tokens:
            return
        rid = f"r{self.n}"
        self.n += 1
        h = hashes(tokens)
        m = self.mgr.match(h)
        if not self.mgr.can_allocate(rid, len(tokens), h, m):
            assert self.mgr.allocate(rid, len(tokens), h, m) is None
            return
        ids = self.mgr.allocate(rid, len(tokens), h, m)
        assert ids is not None and len(ids) == -(-len(tokens) // BLOCK_SIZE)
        self._apply_copies()
        self.reqs[rid] = tokens
        num_hit_tokens = m.num_cached_blocks * BLOCK_SIZE
        for blk in range(m.num_cached_blocks):  # every hit holds this request's tokens
            want = tokens[blk * BLOCK_SIZE : (blk + 1) * BLOCK_SIZE]
            assert self.memory[ids[blk]] == want, f"hit block {ids[blk]} holds other tokens"
        self._write(rid, num_hit_tokens, len(tokens))
        self.mgr.cache_blocks(rid, h, len(tokens))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data(), token=st.integers(0, 3))
    def append(self, data, token):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        tokens = self.reqs[rid]
        if self.mgr.allocate(rid, len(tokens) + 1, hashes(tokens + [token])) is None:
            return
        self._apply_copies()
        tokens.append(token)
        self._write(rid, len(tokens) - 1, len(tokens))
        self.mgr.cache_blocks(rid, hashes(tokens), len(tokens))

    @precondition(lambda self: self.reqs)
    @rule(data=st.data())
    def free(self, data):
        rid = data.draw(st.sampled_from(sorted(self.reqs)))
        del self.reqs[rid]
        self.mgr.free(rid)

    @rule(prefix=st.sampled_from(PREFIXES[:3]), name=st.sampled_from(["p", "q"]))
    def pin(self, prefix, name):
        h = hashes(prefix)
        cached = all(x in self.mgr.pool.cached for x in h)
        result = self.mgr.pin(name, h)
        if result is not None:
            assert cached and result == len(h)

    @rule(name=st.sampled_from(["p", "q"]))
    def unpin(self, name):
        self.mgr.unpin(name)

    @invariant()
    def invariants_hold(self):
        self.mgr.check_invariants()  # among them: no pinned block loses its hash


TestManagerMachine = ManagerMachine.TestCase
TestManagerMachine.settings = settings(max_examples=150, stateful_step_count=40,
                                       deadline=None)
