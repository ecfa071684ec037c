"""Who may pin and how much: pinning is an admin operation.

A pin holds engine blocks out of every tenant's reach, so a tenant's API key may list its
prefixes but not create or delete them. `POST /v1/prefixes` and `DELETE /v1/prefixes/NAME`
need `Authorization: Bearer ADMIN_KEY` (the admin key, router/front/admin_key.py) and
name the tenant in `X-Kvroute-Tenant` (absent: the anonymous tenant ""). With neither API
keys nor an admin key configured (a single-user setup) pins stay open, as before.

Each tenant has a quota of names and of blocks (router/cluster/pin_quota.py), checked by
the registry in the index actor as it reserves a registration's share.
"""

from __future__ import annotations

from collections.abc import Mapping

from router.cluster.pin_quota import PinQuota
from router.front.admin_key import AdminAuth, load_admin_key
from router.front.tenants import TenantAuth
from worker.process_settings import ProcessSettings

TENANT_HEADER = "x-kvroute-tenant"


class PinAdmin:
    def __init__(self, tenants: TenantAuth, admin_key: str | None, quota: PinQuota):
        self._tenants = tenants
        self._admin = AdminAuth(admin_key)
        self._open = admin_key is None and not tenants.enabled
        self.quota = quota

    @classmethod
    def of(cls, tenants: TenantAuth, admin_key_file: str | None, settings: ProcessSettings
           ) -> PinAdmin:
        """The admin key and the pin quota this process's settings give."""
        return cls(tenants, load_admin_key(admin_key_file, settings), PinQuota.of(settings))

    def tenant_for_change(self, headers: Mapping[str, str]) -> str:
        """The tenant a pin or unpin acts for, once the caller is known to be an admin."""
        if self._open:
            return self._tenants.tenant_of(headers.get("authorization"))
        self._admin.check(headers.get("authorization"))
        return headers.get(TENANT_HEADER, "")
