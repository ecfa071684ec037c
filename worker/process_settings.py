"""The settings each kvroute process takes from its own environment: request limits, stream
and pin quotas, API and admin keys, the cache directory.

They are `KVROUTE_<NAME>` variables only (no flags, no Serve config args): key values must
never travel in a Serve config or a runtime_env (Ray logs both), and on a joined cluster a
replica runs in its node's environment. Each process that answers the API loads them once,
at its start (`ProcessSettings.from_environ`), and passes them down; only the cache
directory is loaded where it is used (`default_cache_root`, through the same loader).
`kvroute serve` validates them before Ray starts, and the app builder hands every one but
the keys to its replicas (router/serve/serve_env.py `replica_env`); the Helm chart sets
them on every Ray container (its `limits`, `apiKeys` and `adminKey` values).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, SecretStr

from worker.openai.limits import RequestLimits
from worker.settings import is_secret, load_settings

PositiveInt = Annotated[int, Field(ge=1)]
_LIMITS = RequestLimits()
# The pin quota's defaults (router/cluster/pin_quota.py `PinQuota` takes them from here).
DEFAULT_PIN_MAX_NAMES_PER_TENANT = 16
DEFAULT_PIN_MAX_BLOCKS_PER_TENANT = 1024


class CacheSettings(BaseModel):
    """Where kvroute keeps what it builds once."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    cache_dir: str | None = Field(
        None, min_length=1, description="where kvroute keeps what it builds once: the tiny "
                                        "model, converted GGUF checkpoints, tokenizer "
                                        "directories (unset: ~/.cache/kvroute)")

    def cache_root(self) -> Path:
        return Path(self.cache_dir) if self.cache_dir else Path.home() / ".cache" / "kvroute"


def default_cache_root() -> Path:
    """This process's cache root (`cache_dir`). Loaded where the tiny model, a GGUF
    conversion or a tokenizer directory is first built (the engine, the gateways, the CLI,
    tests), rather than threaded through each of their callers."""
    return load_settings(CacheSettings, {}, os.environ).cache_root()


class ProcessSettings(CacheSettings):
    """What every kvroute process reads from its own environment (`KVROUTE_<NAME>`)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    max_body_bytes: PositiveInt = Field(
        _LIMITS.max_body_bytes, description="a request body's size limit (413 over it)")
    max_prompt_chars: PositiveInt = Field(
        _LIMITS.max_prompt_chars, description="characters of prompt text a request may carry "
                                              "(400 before tokenizing)")
    max_sequences_per_request: PositiveInt = Field(
        _LIMITS.max_sequences, description="engine sequences one request may start: n x the "
                                           "prompts of a batch")
    max_streams_per_tenant: PositiveInt | None = Field(
        None, description="concurrent requests per tenant and process, streamed or not (429 "
                          "over it; unset: 64 with API keys, no limit without)")
    pin_max_names_per_tenant: PositiveInt = Field(
        DEFAULT_PIN_MAX_NAMES_PER_TENANT, description="pinned prefix names per tenant")
    pin_max_blocks_per_tenant: PositiveInt = Field(
        DEFAULT_PIN_MAX_BLOCKS_PER_TENANT, description="pinned KV blocks per tenant")
    api_keys: SecretStr | None = Field(
        None, description="API keys 'key=tenant,...' (with or beside api_keys_file)")
    require_api_keys: bool = Field(
        False, description="refuse to start without API keys (set where the app was built "
                           "with keys, so a replica that finds none does not serve open)")
    admin_key: SecretStr | None = Field(
        None, description="the admin key of the pin and worker APIs (wins over "
                          "admin_key_file)")
    require_admin_key: bool = Field(
        False, description="refuse to start without an admin key (set where the app was "
                           "built with one)")

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> ProcessSettings:
        """The settings from `KVROUTE_<NAME>` variables in `environ` (a process passes its
        own, `os.environ`, once at its start). Raises SettingsError naming a bad one."""
        return load_settings(cls, {}, environ)

    def request_limits(self) -> RequestLimits:
        return RequestLimits(max_body_bytes=self.max_body_bytes,
                             max_prompt_chars=self.max_prompt_chars,
                             max_sequences=self.max_sequences_per_request)


# Settings whose values are secrets: never forwarded in a runtime_env, never printed.
SECRET_SETTINGS = frozenset(name for name, field in ProcessSettings.model_fields.items()
                            if is_secret(field))
