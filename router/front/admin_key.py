"""The admin key: who may change the worker set (`/v1/workers`) and pin prefixes.

The key comes from the `admin_key` process setting (worker/process_settings.py: a variable
in each process's environment), else from the file the `admin_key_file` setting names (its
first line), read by each process at start (so in Kubernetes, a Secret as an environment
variable or a mounted file). Without a key the admin API is off (403). A request without a
key is 401; with a wrong one, 403. Tenant API keys are not admin keys.
"""

from __future__ import annotations

import hmac
from pathlib import Path

from worker.openai.errors import APIError
from worker.process_settings import ProcessSettings
from worker.settings import env_name

ADMIN_KEY_VAR = env_name("admin_key")


def load_admin_key(path: str | None, settings: ProcessSettings) -> str | None:
    """The admin key, or None (admin API off). Raises ValueError for an empty key file, or
    for no key where one is required (`require_admin_key`: the builder, or the chart, sets
    it when the app was built with a key, as without one pins would be open)."""
    key = settings.admin_key.get_secret_value().strip() if settings.admin_key else ""
    if key:
        return key
    if path:
        lines = Path(path).read_text().strip().splitlines()
        if not lines or not lines[0].strip():
            raise ValueError(f"admin key file {path} is empty")
        return lines[0].strip()
    if settings.require_admin_key:
        raise ValueError(f"an admin key is required ({env_name('require_admin_key')}=1: the "
                         f"app was built with one) but this process found none "
                         f"(${ADMIN_KEY_VAR} unset or empty, no admin_key_file; on a joined "
                         f"cluster, set it on the nodes): refusing to start")
    return None


class AdminAuth:
    def __init__(self, key: str | None):
        self._key = key

    def check(self, authorization: str | None) -> None:
        """Returns when `Authorization: Bearer KEY` carries the admin key."""
        if self._key is None:
            raise APIError(403, f"the admin API is off: set {ADMIN_KEY_VAR} or admin_key_file",
                           type_="permission_error", code="admin_api_disabled")
        if not authorization:
            raise APIError(401, "missing admin key: send 'Authorization: Bearer KEY'",
                           type_="authentication_error", code="invalid_api_key")
        scheme, _, key = authorization.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(),
                                                                 self._key.encode()):
            raise APIError(403, "this key may not change the worker set",
                           type_="permission_error", code="not_admin")
