"""Each tenant's quota of pinned prefixes: names and blocks.

Every name is charged its full blocks, even when it pins the same prefix as another name
(duplicates are not free). The quota is checked and a registration's share held in one
step, by the registry that keeps the records (router/cluster/prefix_registry.py, in the
index actor): checked apart from the hold, ten concurrent registers against a quota of
2 names / 64 blocks all passed, and pinned 10 names and 520 blocks.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from worker.process_settings import (
    DEFAULT_PIN_MAX_BLOCKS_PER_TENANT,
    DEFAULT_PIN_MAX_NAMES_PER_TENANT,
    ProcessSettings,
)


class PinRefusal(NamedTuple):
    """Why a registration may not go on: `code` is "pin_quota_exceeded" (the quota) or
    "prefix_being_registered" (another registration of the same name is running)."""

    code: str
    message: str


@dataclass(frozen=True)
class PinQuota:
    max_names_per_tenant: int = DEFAULT_PIN_MAX_NAMES_PER_TENANT
    max_blocks_per_tenant: int = DEFAULT_PIN_MAX_BLOCKS_PER_TENANT

    def __post_init__(self):
        if self.max_names_per_tenant < 1 or self.max_blocks_per_tenant < 1:
            raise ValueError("PinQuota: both limits must be >= 1")

    @classmethod
    def of(cls, settings: ProcessSettings) -> PinQuota:
        """The quota the operator set (`pin_max_*_per_tenant`)."""
        return cls(settings.pin_max_names_per_tenant, settings.pin_max_blocks_per_tenant)

    def refusal(self, tenant: str, num_blocks: int, others: Iterable[int]
                ) -> PinRefusal | None:
        """Whether `tenant` may pin one more name of `num_blocks` blocks beside `others`
        (the blocks of each other name it holds or is registering); None when it may."""
        others = list(others)
        if len(others) + 1 > self.max_names_per_tenant:
            return PinRefusal("pin_quota_exceeded",
                              f"tenant {tenant!r} already pins {len(others)} prefixes "
                              f"(quota {self.max_names_per_tenant} names)")
        used = sum(others)
        if used + num_blocks > self.max_blocks_per_tenant:
            return PinRefusal("pin_quota_exceeded",
                              f"tenant {tenant!r} pins {used} blocks; {num_blocks} more pass "
                              f"its quota of {self.max_blocks_per_tenant}")
        return None
