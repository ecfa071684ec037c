"""Who may pin and how much (issue 14 #1): pinning is an admin operation.

A pin holds engine blocks out of every tenant's reach, so a tenant's API key may list its
prefixes but not create or delete them. `POST /v1/prefixes` and `DELETE /v1/prefixes/NAME`
need `Authorization: Bearer ADMIN_KEY` ($KVROUTE_ADMIN_KEY, router/gateway/admin.py) and
name the tenant in `X-Kvroute-Tenant` (absent: the anonymous tenant ""). With neither API
keys nor an admin key configured (a single-user setup) pins stay open, as before.

Each tenant has a quota of names and of blocks; every name is charged its full blocks,
even when it pins the same prefix as another name (duplicates are not free).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from router.gateway.admin import AdminAuth, load_admin_key
from router.gateway.tenants import TenantAuth
from worker.openai.errors import APIError

TENANT_HEADER = "x-kvroute-tenant"
MAX_NAMES_ENV = "KVROUTE_PIN_MAX_NAMES_PER_TENANT"
MAX_BLOCKS_ENV = "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT"


@dataclass(frozen=True)
class PinQuota:
    max_names_per_tenant: int = 16
    max_blocks_per_tenant: int = 1024

    def __post_init__(self):
        if self.max_names_per_tenant < 1 or self.max_blocks_per_tenant < 1:
            raise ValueError("PinQuota: both limits must be >= 1")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PinQuota:
        environ = os.environ if environ is None else environ
        kw = {}
        for env, name in ((MAX_NAMES_ENV, "max_names_per_tenant"),
                          (MAX_BLOCKS_ENV, "max_blocks_per_tenant")):
            if environ.get(env):
                kw[name] = int(environ[env])
        return cls(**kw)

    def check(self, tenant: str, name: str, num_blocks: int,
              existing: list[tuple[str, int]]) -> None:
        """429 when pinning `name` (`num_blocks` blocks) would pass the tenant's quota;
        `existing` is the tenant's (name, blocks) now (a re-pin of a name replaces it)."""
        others = [(n, b) for n, b in existing if n != name]
        if len(others) + 1 > self.max_names_per_tenant:
            raise APIError(429, f"tenant {tenant!r} already pins {len(others)} prefixes "
                                f"(quota {self.max_names_per_tenant} names)",
                           type_="rate_limit_error", code="pin_quota_exceeded")
        used = sum(b for _, b in others)
        if used + num_blocks > self.max_blocks_per_tenant:
            raise APIError(429, f"tenant {tenant!r} pins {used} blocks; {num_blocks} more "
                                f"pass its quota of {self.max_blocks_per_tenant}",
                           type_="rate_limit_error", code="pin_quota_exceeded")


class PinAdmin:
    def __init__(self, tenants: TenantAuth, admin_key: str | None, quota: PinQuota):
        self._tenants = tenants
        self._admin = AdminAuth(admin_key)
        self._open = admin_key is None and not tenants.enabled
        self.quota = quota

    @classmethod
    def from_env(cls, tenants: TenantAuth, admin_key_file: str | None = None) -> PinAdmin:
        return cls(tenants, load_admin_key(admin_key_file), PinQuota.from_env())

    def tenant_for_change(self, headers: Mapping[str, str]) -> str:
        """The tenant a pin or unpin acts for, once the caller is known to be an admin."""
        if self._open:
            return self._tenants.tenant_of(headers.get("authorization"))
        self._admin.check(headers.get("authorization"))
        return headers.get(TENANT_HEADER, "")
