"""API keys -> tenants. A tenant's name is its cache salt (Protocol 1), so tenants never
share KV blocks; without configured keys every request is the anonymous tenant "".

Keys come from a file (`--api-keys-file FILE`): a JSON object {"key": "tenant", ...} or lines
`KEY TENANT` (blank lines and `#` comments skipped), and/or the `api_keys` process setting
(worker/process_settings.py: `KVROUTE_<NAME>` in each process's environment) as
"key1=tenant-a,key2=tenant-b".
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Mapping
from pathlib import Path

from worker.openai.errors import APIError
from worker.process_settings import ProcessSettings
from worker.settings import env_name

API_KEYS_VAR = env_name("api_keys")
ANONYMOUS_TENANT = ""


def parse_api_keys_text(text: str) -> dict[str, str]:
    text = text.strip()
    if text.startswith("{"):
        data = json.loads(text)
        if not all(isinstance(k, str) and isinstance(v, str) and k and v
                   for k, v in data.items()):
            raise ValueError("API key file: keys and tenants must be non-empty strings")
        return dict(data)
    keys: dict[str, str] = {}
    for lineno, line in enumerate(text.splitlines(), 1):
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        parts = line.split()
        if len(parts) != 2:
            raise ValueError(f"API key file line {lineno}: expected 'KEY TENANT'")
        keys[parts[0]] = parts[1]
    return keys


def parse_api_keys_env(value: str) -> dict[str, str]:
    keys: dict[str, str] = {}
    for position, item in enumerate(filter(None, (p.strip() for p in value.split(","))), 1):
        key, sep, tenant = item.partition("=")
        if not sep or not key or not tenant:
            # Never echo the entry: it holds a secret.
            raise ValueError(f"{API_KEYS_VAR}: entry {position} is not a key=tenant pair")
        keys[key] = tenant
    return keys


def load_api_keys(path: str | None, settings: ProcessSettings) -> dict[str, str]:
    """Key -> tenant from the file (if any) and the `api_keys` setting (which wins on a
    clash). Raises ValueError for no key where keys are required (`require_api_keys`: the
    builder, or the chart, sets it when the app was built with keys, so a process that
    finds none refuses to start rather than serve unauthenticated)."""
    keys = parse_api_keys_text(Path(path).read_text()) if path else {}
    if settings.api_keys is not None:
        keys.update(parse_api_keys_env(settings.api_keys.get_secret_value()))
    if not keys and settings.require_api_keys:
        raise ValueError(f"API keys are required ({env_name('require_api_keys')}=1: the app "
                         f"was built with keys) but this process found none (api_keys_file "
                         f"{path or 'unset'}, ${API_KEYS_VAR} unset or empty; on a joined "
                         f"cluster, give a keys file every node has or set the variable on "
                         f"the nodes): refusing to serve unauthenticated")
    return keys


class TenantAuth:
    """Maps a request's `Authorization: Bearer KEY` to its tenant."""

    def __init__(self, keys: Mapping[str, str]):
        self._keys = dict(keys)
        self._key_bytes = [(key.encode("utf-8"), tenant) for key, tenant in self._keys.items()]

    @property
    def enabled(self) -> bool:
        return bool(self._keys)

    def tenant_of(self, authorization: str | None) -> str:
        if not self._keys:
            return ANONYMOUS_TENANT
        if not authorization:
            raise APIError(401, "missing API key: send 'Authorization: Bearer KEY'",
                           code="invalid_api_key")
        scheme, _, key = authorization.partition(" ")
        tenant = self._match(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")
        return tenant

    def _match(self, key: str) -> str | None:
        """The key's tenant, compared in constant time against every key (a dict lookup or
        `==` would leak through timing how much of a guess is right)."""
        given = key.encode("utf-8", "surrogateescape")
        found = None
        for candidate, tenant in self._key_bytes:
            if hmac.compare_digest(candidate, given):
                found = tenant
        return found
