"""API keys -> tenants. A tenant's name is its cache salt (Protocol 1), so tenants never
share KV blocks; without configured keys every request is the anonymous tenant "".

Keys come from a file (`--api-keys-file FILE`): a JSON object {"key": "tenant", ...} or lines
`KEY TENANT` (blank lines and `#` comments skipped), and/or the environment variable
`KVROUTE_API_KEYS="key1=tenant-a,key2=tenant-b"`.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from pathlib import Path

from worker.openai.errors import APIError

API_KEYS_ENV = "KVROUTE_API_KEYS"
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
    for item in filter(None, (p.strip() for p in value.split(","))):
        key, sep, tenant = item.partition("=")
        if not sep or not key or not tenant:
            raise ValueError(f"{API_KEYS_ENV}: expected key=tenant pairs, got {item!r}")
        keys[key] = tenant
    return keys


def load_api_keys(path: str | None, environ: Mapping[str, str] | None = None) -> dict[str, str]:
    """Key -> tenant from the file (if any) and the environment (which wins on a clash)."""
    environ = os.environ if environ is None else environ
    keys = parse_api_keys_text(Path(path).read_text()) if path else {}
    keys.update(parse_api_keys_env(environ.get(API_KEYS_ENV, "")))
    return keys


class TenantAuth:
    """Maps a request's `Authorization: Bearer KEY` to its tenant."""

    def __init__(self, keys: Mapping[str, str]):
        self._keys = dict(keys)

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
        tenant = self._keys.get(key.strip()) if scheme.lower() == "bearer" else None
        if tenant is None:
            raise APIError(401, "incorrect API key provided", code="invalid_api_key")
        return tenant
