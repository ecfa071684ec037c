"""One external worker's block hashes mapped to Protocol 1 hashes through token ids.

An engine's block hashes (vLLM: sha256 or 64-bit ints, with its own seed) are opaque to
kvroute. A vLLM BlockStored carries each block's token ids and the hash of the block before
it, so this map rebuilds kvroute's chain (kv/hashing.py: namespace root from model, LoRA
adapter and cache salt, then xxh3-128 per router block) block by block, and turns the
worker's events into Protocol 2 events on router hashes that ReplicaLog applies unchanged.

Engine and router block sizes may differ. A router block is cached in a medium when every
engine block holding one of its tokens is cached there. Engine block size 16, router 32:

    tokens   0 ........ 15 | 16 ....... 31 | 32 ....... 47 | 48 ....... 63
    engine   [    e0      ] [    e1       ] [    e2       ] [    e3       ]
    router   [            r0              ] [            r1               ]
                                   ^ r0 completes in e1: instance (r0, e1), sources e0, e1

Router 16, engine 32: each engine block completes two router blocks, each sourced by that
engine block alone. An "instance" of a router block is the set of engine blocks that hold
its tokens in one engine chain (keyed by the router hash and the engine block where it
completes); the router block is cached in a medium while one of its instances is complete
there. Engine blocks count physical copies per medium (vLLM stores a hash once per copy).

Blocks whose parent is unknown (stored before the subscriber listened, or its event was
lost), or whose extra keys carry multimodal or prompt-embedding inputs that token ids do not
describe, cannot be mapped: they are counted and left out, so the map holds a subset of
what the worker caches and never a block it does not.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import NamedTuple

from kv.events import AllBlocksCleared, BlockRemoved, BlockStored, KVEvent, Medium
from kv.hashing import BlockHash, hash_block, namespace_root
from protocol.vllm import wire

EngineHash = bytes | int
_InstanceKey = tuple[BlockHash, EngineHash]  # (router hash, engine block it completes in)
_MEDIA: dict[str | None, Medium] = {None: "device", wire.MEDIUM_GPU: "device",
                                    wire.MEDIUM_CPU: "host"}
_FULL_ATTENTION_KINDS = (None, "full_attention")


@dataclass(frozen=True)
class EngineHashConfig:
    model: str  # the served model name the router hashes with
    router_block_size: int
    # vLLM versions before lora_name send only lora_id: the adapter name of each id
    lora_names_by_id: dict[int, str] = field(default_factory=dict)

    def __post_init__(self):
        if not self.model:
            raise ValueError("EngineHashConfig: model must be a non-empty name")
        if not isinstance(self.router_block_size, int) or self.router_block_size <= 0:
            raise ValueError(f"EngineHashConfig: router_block_size must be a positive "
                             f"integer, got {self.router_block_size!r}")


@dataclass
class MapStats:
    num_mapped_blocks: int = 0  # engine blocks given router hashes
    num_unmapped_blocks: int = 0  # engine blocks stored that could not be mapped
    num_ignored_events: int = 0  # other media (STORAGE) or non-full-attention KV groups


class _Chain(NamedTuple):
    """Kvroute's chain at the end of one engine block."""

    last_hash: BlockHash  # the last complete router block (the namespace root if none)
    leftover_token_ids: tuple[int, ...]  # tokens after it, fewer than a router block
    leftover_sources: tuple[EngineHash, ...]  # the engine blocks those tokens are in


class _EngineBlock:
    __slots__ = ("chain", "copies")

    def __init__(self, chain: _Chain):
        self.chain = chain
        self.copies: dict[Medium, int] = {"device": 0, "host": 0}


class EngineHashMap:
    """Maps one worker's vLLM events to Protocol 2 events on router hashes."""

    def __init__(self, config: EngineHashConfig):
        self.config = config
        self.stats = MapStats()
        self._reset()

    def _reset(self) -> None:
        self._blocks: dict[EngineHash, _EngineBlock] = {}
        self._instances: dict[_InstanceKey, tuple[EngineHash, ...]] = {}  # -> sources
        # the instances an engine block is in, in the order made (a dict: emitted hashes
        # follow the chain, not set order)
        self._uses: dict[EngineHash, dict[_InstanceKey, None]] = {}
        self._complete: dict[Medium, set[_InstanceKey]] = {"device": set(), "host": set()}
        self._num_complete: dict[Medium, dict[BlockHash, int]] = {"device": {}, "host": {}}
        self._ignored_groups: set[int] = set()

    def apply(self, event: wire.VllmEvent) -> KVEvent | None:
        """The Protocol 2 event for one vLLM event; None when no router block changed."""
        if isinstance(event, wire.AllBlocksCleared):
            self.clear()
            return AllBlocksCleared()
        medium = self._medium_of(event)
        if medium is None:
            self.stats.num_ignored_events += 1
            return None
        if isinstance(event, wire.BlockStored):
            changed = self._store(event, medium)
            return BlockStored(tuple(changed), None, medium) if changed else None
        changed = [r for e in event.block_hashes for r in self._remove_copy(e, medium)]
        return BlockRemoved(tuple(changed), medium) if changed else None

    def clear(self) -> None:
        """Forgets every block (the worker cleared its cache or restarted); keeps the stats."""
        self._reset()

    def contents(self) -> dict[Medium, set[BlockHash]]:
        """Router hashes cached per medium."""
        return {m: set(counts) for m, counts in self._num_complete.items()}

    # -- stores ----------------------------------------------------------------------------

    def _medium_of(self, event: wire.BlockStored | wire.BlockRemoved) -> Medium | None:
        group = event.group_idx
        if isinstance(event, wire.BlockStored) and group is not None:
            if event.kv_cache_spec_kind not in _FULL_ATTENTION_KINDS:
                self._ignored_groups.add(group)
                return None
        if group is not None and group in self._ignored_groups:
            return None
        return _MEDIA.get(event.medium)

    def _store(self, event: wire.BlockStored, medium: Medium) -> list[BlockHash]:
        hashes, token_ids, size = event.block_hashes, event.token_ids, event.block_size
        if size <= 0 or len(token_ids) != size * len(hashes):
            self.stats.num_unmapped_blocks += len(hashes)
            return []
        lora_name = self._lora_name(event)
        chain = self._start_chain(event, lora_name)
        changed: list[BlockHash] = []
        for i, engine_hash in enumerate(hashes):
            block = self._blocks.get(engine_hash)  # a known hash: content-addressed
            if block is None:
                keys = event.extra_keys[i] if event.extra_keys else None
                if chain is None or not self._plain_keys(keys, lora_name, i, event):
                    self.stats.num_unmapped_blocks += 1
                    chain = None  # its descendants cannot be mapped either
                    continue
                block = self._new_block(engine_hash, chain, token_ids[i * size:(i + 1) * size])
            chain = block.chain
            changed.extend(self._add_copy(engine_hash, block, medium))
        return changed

    def _lora_name(self, event: wire.BlockStored) -> str | None:
        """The adapter name ("" without LoRA); None when only an unknown lora_id is given."""
        if event.lora_name is not None:
            return event.lora_name
        if event.lora_id is None:
            return ""
        return self.config.lora_names_by_id.get(event.lora_id)

    def _start_chain(self, event: wire.BlockStored, lora_name: str | None) -> _Chain | None:
        if lora_name is None:
            return None
        if event.parent_block_hash is not None:
            parent = self._blocks.get(event.parent_block_hash)
            return parent.chain if parent is not None else None
        first_keys = event.extra_keys[0] if event.extra_keys else None
        salts = [k for k in (first_keys or ()) if isinstance(k, str)]
        if lora_name and salts and salts[0] == lora_name:
            salts = salts[1:]
        if len(salts) > 1:
            return None
        root = namespace_root(self.config.model, lora_name, salts[0] if salts else "")
        return _Chain(root, (), ())

    @staticmethod
    def _plain_keys(keys: Sequence | None, lora_name: str, index: int,
                    event: wire.BlockStored) -> bool:
        """True when a block's extra keys hold only its LoRA name and (a root block) the
        cache salt: the inputs kvroute's namespace root covers."""
        if not keys:
            return True
        rest = list(keys)
        if lora_name and rest[0] == lora_name:
            rest = rest[1:]
        is_root_block = index == 0 and event.parent_block_hash is None
        return not rest or (is_root_block and len(rest) == 1 and isinstance(rest[0], str))

    def _new_block(self, engine_hash: EngineHash, chain: _Chain,
                   token_ids: Sequence[int]) -> _EngineBlock:
        size = self.config.router_block_size
        buf = chain.leftover_token_ids + tuple(token_ids)
        sources = chain.leftover_sources + (engine_hash,)
        prev, pos = chain.last_hash, 0
        while len(buf) - pos >= size:
            router_hash = hash_block(prev, buf[pos:pos + size])
            # Only the first router block can start in an earlier engine block.
            self._add_instance((router_hash, engine_hash), sources if pos == 0
                               else (engine_hash,))
            prev, pos = router_hash, pos + size
        if pos:
            sources = (engine_hash,) if pos < len(buf) else ()
        block = _EngineBlock(_Chain(prev, buf[pos:], sources))
        self._blocks[engine_hash] = block
        self.stats.num_mapped_blocks += 1
        return block

    def _add_instance(self, key: _InstanceKey, sources: tuple[EngineHash, ...]) -> None:
        self._instances[key] = sources
        for source in sources:
            self._uses.setdefault(source, {})[key] = None

    # -- presence --------------------------------------------------------------------------

    def _add_copy(self, engine_hash: EngineHash, block: _EngineBlock,
                  medium: Medium) -> list[BlockHash]:
        block.copies[medium] += 1
        if block.copies[medium] > 1:
            return []
        stored = []
        complete, counts = self._complete[medium], self._num_complete[medium]
        for key in self._uses.get(engine_hash, ()):
            if key in complete:
                continue
            sources = self._instances[key]
            if len(sources) > 1 and not all(self._held(s, medium) for s in sources):
                continue  # (one source: this block, held now)
            complete.add(key)
            counts[key[0]] = counts.get(key[0], 0) + 1
            if counts[key[0]] == 1:
                stored.append(key[0])
        return stored

    def _remove_copy(self, engine_hash: EngineHash, medium: Medium) -> list[BlockHash]:
        block = self._blocks.get(engine_hash)
        if block is None or block.copies[medium] == 0:
            return []  # unmapped, or a removal we have no store for
        block.copies[medium] -= 1
        if block.copies[medium]:
            return []
        removed = []
        complete, counts = self._complete[medium], self._num_complete[medium]
        for key in self._uses.get(engine_hash, ()):
            if key in complete:
                complete.discard(key)
                counts[key[0]] -= 1
                if counts[key[0]] == 0:
                    del counts[key[0]]
                    removed.append(key[0])
        if not any(block.copies.values()):
            self._forget(engine_hash)
        return removed

    def _held(self, engine_hash: EngineHash, medium: Medium) -> bool:
        block = self._blocks.get(engine_hash)
        return block is not None and block.copies[medium] > 0

    def _forget(self, engine_hash: EngineHash) -> None:
        """Drops a block held nowhere, and the router-block instances that complete in it
        (its children, if stored again, complete new ones)."""
        del self._blocks[engine_hash]
        for key in [k for k in self._uses.get(engine_hash, ()) if k[1] == engine_hash]:
            for source in self._instances.pop(key):
                uses = self._uses[source]
                uses.pop(key, None)
                if not uses:
                    del self._uses[source]

    def check_invariants(self) -> None:
        for key, sources in self._instances.items():
            assert key[1] in self._blocks, f"instance {key} outlived its engine block"
            for source in sources:
                assert key in self._uses.get(source, ()), f"{key} missing from uses"
        for source, keys in self._uses.items():
            assert keys and all(source in self._instances[k] for k in keys)
        for engine_hash, block in self._blocks.items():
            assert any(block.copies.values()), f"{engine_hash!r} is held nowhere"
            assert min(block.copies.values()) >= 0
        for medium, complete in self._complete.items():
            expected = {k for k, sources in self._instances.items()
                        if all(self._held(s, medium) for s in sources)}
            assert complete == expected, f"{medium}: complete instances drifted"
            counts: dict[BlockHash, int] = {}
            for router_hash, _ in complete:
                counts[router_hash] = counts.get(router_hash, 0) + 1
            assert counts == self._num_complete[medium], f"{medium}: counts drifted"
