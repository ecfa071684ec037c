"""Whole-prompt pins (`RouterConfig.mark_whole_prompt`): an outstanding request's pending
marks start past the device run it was routed to (that run was cached there), so a decision
marks only what the request computes. The run is pinned instead: once events show its end
evicted while the request waits, the marks grow back over the lost part, for the request
will hold its whole prompt there when it runs. A decision costs nothing more.

An engine evicts a cached run from its end (a block is used no later than its parent, and a
request frees its blocks tail first), so the run's last block tells whether any of it went.
"""

from __future__ import annotations

from collections.abc import KeysView

from router.core.index import PrefixIndex
from router.core.ledger import Ledger


class PinnedRuns:
    """replica -> {request id: its confirmed device run, in blocks} for the outstanding
    requests whose cached part is pinned."""

    def __init__(self) -> None:
        self._by_replica: dict[str, dict[str, int]] = {}

    def replica_ids(self) -> KeysView[str]:
        return self._by_replica.keys()

    def pin(self, replica_id: str, request_id: str, num_blocks: int) -> None:
        self._by_replica.setdefault(replica_id, {})[request_id] = num_blocks

    def unpin(self, replica_id: str, request_id: str) -> None:
        pins = self._by_replica.get(replica_id)
        if pins and pins.pop(request_id, None) is not None and not pins:
            del self._by_replica[replica_id]

    def drop_replica(self, replica_id: str) -> None:
        self._by_replica.pop(replica_id, None)

    def __len__(self) -> int:
        return sum(len(pins) for pins in self._by_replica.values())

    def on_evictions(self, replica_id: str, index: PrefixIndex, ledger: Ledger) -> None:
        """After the replica's events were applied: each pinned request whose run lost its
        end since it was routed gets marks over the lost part too (its ledger record holds
        them), and stays pinned on what is left of the run."""
        pins = self._by_replica.get(replica_id)
        if not pins:
            return
        on_device = index.held_view(replica_id, "device")
        for request_id, n in list(pins.items()):
            entry = ledger.get(request_id)
            hashes = entry.block_hashes
            if hashes[n - 1] in on_device:
                continue
            k = index.num_confirmed_device_blocks(replica_id, hashes[:n - 1])
            index.mark_pending(replica_id, hashes[k:n], held=True)
            ledger.put(request_id, entry._replace(held=hashes[k:]))
            if k:
                pins[request_id] = k
            else:
                del pins[request_id]
        if not pins:
            del self._by_replica[replica_id]

    def check_invariants(self, ledger: Ledger) -> None:
        for replica_id, pins in self._by_replica.items():
            assert pins, f"empty pins of {replica_id}"
            for request_id, n in pins.items():
                entry = ledger.get(request_id)
                assert entry.replica_id == replica_id, f"{request_id} pinned off its replica"
                assert 0 < n == len(entry.block_hashes) - len(entry.held), (
                    f"{request_id}: pinned run of {n} blocks, marks from "
                    f"{len(entry.block_hashes) - len(entry.held)}")
