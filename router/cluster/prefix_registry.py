"""The named pinned prefixes of the cluster, shared by every gateway process.

Kept by the KV index actor. A prefix whose replica is gone becomes an orphan: it is offered
to one gateway at a time (a claim with a lease) to be warmed again on another replica. A
restarted actor has no records: each replica reports the prefixes it holds pinned with its
first snapshot to the new actor, and the records are rebuilt from those (`adopt`).

The registry owns each tenant's pin quota (router/cluster/pin_quota.py): a registration
reserves its share before it pins anything (`reserve`), and `put` turns the reservation
into the record, so concurrent registrations (from any number of gateways) cannot pass the
quota together.
"""

from __future__ import annotations

import asyncio
import dataclasses
import time
from dataclasses import dataclass

from protocol.engine import PinnedPrefix
from router.cluster.pin_quota import PinQuota, PinRefusal

# A reservation whose gateway never ends it (the gateway died mid-pin) stops counting after
# this long; a pin is one prefill, done in seconds.
RESERVATION_LEASE_S = 600.0


@dataclass(frozen=True)
class PrefixRecord:
    """A named pinned prefix and where it is warmed ("" while no replica holds it: its
    replica is gone and a gateway is to warm it again elsewhere)."""

    name: str
    tenant: str
    num_prompt_tokens: int
    num_pinned_blocks: int
    replica_id: str
    prompt_token_ids: tuple[int, ...] = ()  # what to compute again when its replica is gone

    @property
    def key(self) -> tuple[str, str]:
        return self.tenant, self.name


def engine_pin_name(tenant: str, name: str) -> str:
    """The name a prefix is pinned under in the engine: "tenant/name" (pinned with the
    tenant's salt, so it only ever serves that tenant)."""
    return f"{tenant}/{name}"


def record_of_pin(pin: PinnedPrefix, replica_id: str) -> PrefixRecord | None:
    """The record of a prefix a replica reports pinned; None for a pin not made through
    `/v1/prefixes` (its name is not "tenant/name" with the salt as tenant)."""
    prefix = pin.cache_salt + "/"
    if not pin.name.startswith(prefix) or len(pin.name) == len(prefix):
        return None
    return PrefixRecord(pin.name[len(prefix):], pin.cache_salt, len(pin.prompt_token_ids),
                        pin.num_pinned_blocks, replica_id, pin.prompt_token_ids)


class PrefixRegistry:
    def __init__(self):
        self._prefixes: dict[tuple[str, str], PrefixRecord] = {}
        # orphaned prefixes handed to a gateway to warm again: key -> claim expiry
        self._claims: dict[tuple[str, str], float] = {}
        self._orphans = asyncio.Event()  # set while some record has no replica
        # registrations being pinned: key -> (blocks held of the quota, expiry)
        self._reserved: dict[tuple[str, str], tuple[int, float]] = {}

    def reserve(self, tenant: str, name: str, num_blocks: int, block_size: int,
                quota: PinQuota) -> PinRefusal | None:
        """Checks the tenant's quota for one more name of `num_blocks` blocks and holds them
        until `put` stores its record or `release` gives them back (or the lease runs out);
        None when reserved. A stored record of the same name is replaced, so it does not
        count; another registration of the same name still running is a refusal."""
        now = time.monotonic()
        for key in [k for k, (_, expiry) in self._reserved.items() if expiry <= now]:
            del self._reserved[key]
        key = (tenant, name)
        if key in self._reserved:
            return PinRefusal("prefix_being_registered",
                              f"prefix {name!r} is being registered by another request; "
                              "retry when it is done")
        others = [r.num_prompt_tokens // block_size for k, r in self._prefixes.items()
                  if r.tenant == tenant and k != key]
        others += [blocks for (t, _), (blocks, _) in self._reserved.items() if t == tenant]
        refusal = quota.refusal(tenant, num_blocks, others)
        if refusal is None:
            self._reserved[key] = (num_blocks, now + RESERVATION_LEASE_S)
        return refusal

    def release(self, tenant: str, name: str) -> None:
        """A reserved registration failed: its share of the quota is free again."""
        self._reserved.pop((tenant, name), None)

    def put(self, record: PrefixRecord) -> PrefixRecord | None:
        """Stores a record (ending its reservation); returns the one it replaces (to
        unpin), if any."""
        old = self._prefixes.get(record.key)
        self._prefixes[record.key] = record
        self._claims.pop(record.key, None)
        self._reserved.pop(record.key, None)
        return old

    def adopt(self, record: PrefixRecord) -> bool:
        """Stores a record a replica reported, unless one of its key is already here (the
        registry's own word wins: it may have been re-pinned elsewhere). True if stored."""
        if record.key in self._prefixes:
            return False
        self._prefixes[record.key] = record
        return True

    def pop(self, tenant: str, name: str) -> PrefixRecord | None:
        self._claims.pop((tenant, name), None)
        return self._prefixes.pop((tenant, name), None)

    def orphan_replica(self, replica_id: str) -> None:
        """The replica is gone: its prefixes are to be warmed again elsewhere."""
        for key, record in list(self._prefixes.items()):
            if record.replica_id == replica_id:
                self._prefixes[key] = dataclasses.replace(record, replica_id="",
                                                          num_pinned_blocks=0)
                self._orphans.set()

    async def claim_orphans(self, wait_s: float, lease_s: float) -> list[PrefixRecord]:
        """Records whose replica is gone, for the caller to warm again; each is claimed by
        one caller for `lease_s` (then offered again, if that caller died). Waits up to
        `wait_s` for one to appear."""
        try:
            await asyncio.wait_for(self._orphans.wait(), timeout=wait_s)
        except asyncio.TimeoutError:
            return []
        now = time.monotonic()
        out = [r for r in self._prefixes.values()
               if not r.replica_id and self._claims.get(r.key, 0.0) <= now]
        for record in out:
            self._claims[record.key] = now + lease_s
        self._orphans.clear()
        if self._claims:  # wake a caller again when the earliest lease runs out
            asyncio.get_running_loop().call_later(
                max(0.0, min(self._claims.values()) - now), self._offer_orphans_again)
        return out

    def place(self, orphan: PrefixRecord, placed: PrefixRecord) -> bool:
        """Records where an orphan was warmed again, unless it changed meanwhile (deleted
        or registered again): False then, and the caller unpins what it warmed."""
        key = orphan.key
        self._claims.pop(key, None)
        if self._prefixes.get(key) != orphan:
            return False
        self._prefixes[key] = placed
        return True

    def release_claim(self, orphan: PrefixRecord) -> None:
        """The claimer could not warm the orphan: offer it again."""
        if self._claims.pop(orphan.key, None) is not None and self._prefixes.get(
                orphan.key) == orphan:
            self._orphans.set()

    def of_tenant(self, tenant: str) -> list[PrefixRecord]:
        return sorted((p for p in self._prefixes.values() if p.tenant == tenant),
                      key=lambda p: p.name)

    def _offer_orphans_again(self) -> None:
        now = time.monotonic()
        for key in [k for k, t in self._claims.items() if t <= now]:
            del self._claims[key]
            record = self._prefixes.get(key)
            if record is not None and not record.replica_id:
                self._orphans.set()
