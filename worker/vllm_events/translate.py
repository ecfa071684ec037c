"""kvroute's Protocol 2 events (kv/events.py) as vLLM KV events.

A vLLM BlockStored carries each block's tokens, its parent's hash, the LoRA name and (first
block of a chain) the cache salt. Kvroute's device stores carry their tokens when the event
log records them (`EventLog.with_token_ids`); host-tier copies and copy-backs do not, so the
translator keeps, for every block held in some medium, its parent, tokens and namespace,
and takes them from there. The same records rebuild the whole contents as events: after a
gap in kvroute's log (`reset`) and for a subscriber that asks for a snapshot
(`snapshot_events`).

The namespace of a chain's first block (adapter and salt) is found by hashing its tokens
under each root the engine has used (`namespaces`): the block hash is
`xxh3_128(root + tokens)` (kv/hashing.py), so exactly one root matches. Blocks whose tokens
or namespace are unknown are left out (counted): a subscriber then knows a subset of what
the engine holds, never a block it does not.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kv.events import BlockRemoved, BlockStored, KVEvent, Medium, Snapshot
from kv.hashing import BlockHash, hash_block, namespace_root
from protocol.vllm import wire

Namespace = tuple[str, str]  # (LoRA adapter name, cache salt), "" when absent
VLLM_MEDIUM: dict[Medium, str] = {"device": wire.MEDIUM_GPU, "host": wire.MEDIUM_CPU}


@dataclass
class _Held:
    parent_hash: BlockHash | None
    token_ids: tuple[int, ...]
    namespace: Namespace
    media: set[Medium]


class VllmEventTranslator:
    """Turns one engine's Protocol 2 events into vLLM events, in order.

    Args:
        model: the served model name (part of every namespace root).
        block_size: the engine's tokens per block.
    """

    def __init__(self, model: str, block_size: int):
        if block_size <= 0:
            raise ValueError(f"block_size must be positive, got {block_size}")
        self.model = model
        self.block_size = block_size
        self.num_unpublished_blocks = 0  # stored blocks left out: tokens or namespace unknown
        self._held: dict[BlockHash, _Held] = {}
        self._roots: dict[Namespace, BlockHash] = {}
        self._lora_ids: dict[str, int] = {}  # vLLM's deprecated int id, 1, 2, ... by name

    def translate(self, events: Iterable[KVEvent],
                  namespaces: Iterable[Namespace] = ()) -> list[wire.VllmEvent]:
        """The vLLM events for `events`; `namespaces` are the engine's (adapter, salt) pairs
        (Engine.namespaces()), needed to name the chains that start in these events."""
        for namespace in namespaces:
            if namespace not in self._roots:
                self._roots[namespace] = namespace_root(self.model, *namespace)
        out: list[wire.VllmEvent] = []
        for event in events:
            if isinstance(event, BlockStored):
                out.extend(self._stored(event))
            elif isinstance(event, BlockRemoved):
                out.append(wire.BlockRemoved(block_hashes=list(event.block_hashes),
                                             medium=VLLM_MEDIUM[event.medium]))
                for block_hash in event.block_hashes:
                    held = self._held.get(block_hash)
                    if held is not None:
                        held.media.discard(event.medium)
                        if not held.media:
                            del self._held[block_hash]
            else:
                self._held.clear()
                out.append(wire.AllBlocksCleared())
        return out

    def reset(self, snapshot: Snapshot) -> list[wire.VllmEvent]:
        """After a gap in the engine's log: its contents are `snapshot`; keep the records of
        the blocks it holds and announce them again after an AllBlocksCleared."""
        held_in: dict[BlockHash, set[Medium]] = {}
        for medium, hashes in (("device", snapshot.device_hashes),
                               ("host", snapshot.host_hashes)):
            for block_hash in hashes:
                held_in.setdefault(block_hash, set()).add(medium)  # type: ignore[arg-type]
        self.num_unpublished_blocks += sum(1 for h in held_in if h not in self._held)
        kept = {}
        for block_hash, media in held_in.items():
            if block_hash in self._held:
                kept[block_hash] = self._held[block_hash]
                kept[block_hash].media = media
        self._held = kept
        return self.snapshot_events()

    def snapshot_events(self) -> list[wire.VllmEvent]:
        """AllBlocksCleared, then every held block, parents before children."""
        depth: dict[BlockHash, int] = {}

        def depth_of(block_hash: BlockHash) -> int:
            path, h = [], block_hash
            while h not in depth:
                path.append(h)
                parent = self._held[h].parent_hash
                if parent is None or parent not in self._held:
                    break  # a chain's first block, or its parent is held nowhere
                h = parent
            d = depth.get(h, -1)  # -1: the loop stopped at a chain start
            for p in reversed(path):
                d += 1
                depth[p] = d
            return depth[block_hash]

        order = sorted(self._held, key=depth_of)
        out: list[wire.VllmEvent] = [wire.AllBlocksCleared()]
        for medium in ("device", "host"):
            for block_hash in order:
                held = self._held[block_hash]
                if medium in held.media:
                    out.append(self._vllm_stored([block_hash], medium))
        return out

    # -- stores ----------------------------------------------------------------------------

    def _stored(self, event: BlockStored) -> list[wire.BlockStored]:
        size = self.block_size
        if event.token_ids and len(event.token_ids) != size * len(event.block_hashes):
            raise ValueError(f"a store of {len(event.block_hashes)} blocks carries "
                             f"{len(event.token_ids)} tokens at block size {size}")
        runs: list[list[BlockHash]] = [[]]
        parent = event.parent_hash
        for i, block_hash in enumerate(event.block_hashes):
            held = self._held.get(block_hash)
            if held is None and event.token_ids:
                token_ids = tuple(event.token_ids[i * size:(i + 1) * size])
                namespace = self._namespace(block_hash, parent, token_ids)
                if namespace is not None:
                    held = self._held[block_hash] = _Held(parent, token_ids, namespace, set())
            if held is None:
                self.num_unpublished_blocks += 1
                runs.append([])
            else:
                held.media.add(event.medium)
                runs[-1].append(block_hash)
            parent = block_hash
        return [self._vllm_stored(run, event.medium) for run in runs if run]

    def _namespace(self, block_hash: BlockHash, parent: BlockHash | None,
                   token_ids: tuple[int, ...]) -> Namespace | None:
        if parent is not None:
            held = self._held.get(parent)
            return held.namespace if held is not None else None
        for namespace, root in self._roots.items():
            if hash_block(root, token_ids) == block_hash:
                return namespace
        return None

    def _vllm_stored(self, run: list[BlockHash], medium: Medium) -> wire.BlockStored:
        """One vLLM store of a chain of held blocks (each the parent of the next)."""
        first = self._held[run[0]]
        adapter, salt = first.namespace
        extra_keys: list[tuple | None] | None = None
        if adapter or (salt and first.parent_hash is None):
            extra_keys = [(adapter,) if adapter else None for _ in run]
            if salt and first.parent_hash is None:  # vLLM: the salt is in block 0's keys
                extra_keys[0] = tuple(k for k in (adapter, salt) if k)
        if adapter and adapter not in self._lora_ids:
            self._lora_ids[adapter] = len(self._lora_ids) + 1
        return wire.BlockStored(
            block_hashes=list(run), parent_block_hash=first.parent_hash,
            token_ids=[t for h in run for t in self._held[h].token_ids],
            block_size=self.block_size, lora_id=self._lora_ids.get(adapter) if adapter else None,
            medium=VLLM_MEDIUM[medium], lora_name=adapter or None, extra_keys=extra_keys)
