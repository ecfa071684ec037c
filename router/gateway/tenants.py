"""API keys -> tenants. A tenant's name is its cache salt (Protocol 1), so tenants never
share KV blocks; without configured keys every request is the anonymous tenant "".

Keys come from a file (`--api-keys-file FILE`): a JSON object {"key": "tenant", ...} or lines
`KEY TENANT` (blank lines and `#` comments skipped), and/or the environment variable
`KVROUTE_API_KEYS="key1=tenant-a,key2=tenant-b"`.
"""

from __future__ import annotations

import hmac
import json
import os
from collections.abc import Mapping
from pathlib import Path

from worker.openai.errors import APIError

API_KEYS_ENV = "KVROUTE_API_KEYS"
# Set to 1 by the app builder (or the chart) when the app was built with keys: a process
# that then finds none refuses to start rather than serve unauthenticated.
REQUIRE_API_KEYS_ENV = "KVROUTE_REQUIRE_API_KEYS"
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
            raise ValueError(f"{API_KEYS_ENV}: entry {position} is not a key=tenant pair")
        keys[key] = tenant
    return keys


def load_api_keys(path: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Key -> tenant from the file (if any) and the environment (which wins on a clash)."""
    environ = os.environ if environ is None else environ
    keys = parse_api_keys_text(Path(path).read_text()) if path else {}
    keys.update(parse_api_keys_env(environ.get(API_KEYS_ENV, "")))
    if not keys and environ.get(REQUIRE_API_KEYS_ENV) == "1":
        raise ValueError(f"API keys are required ({REQUIRE_API_KEYS_ENV}=1: the app was built "
                         f"with keys) but this process found none (api_keys_file "
                         f"{path or 'unset'}, ${API_KEYS_ENV} unset or empty; on a joined "
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
