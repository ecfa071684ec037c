"""Each process's own settings (worker/process_settings.py): one field per variable, its
name derived from the field, a bad value named with its source, a key never printed."""

import pytest
from pydantic import BaseModel, Field, SecretStr

from router.serve.serve_env import replica_env
from router.serve.settings import ServeSettings
from worker.openai.limits import RequestLimits
from worker.process_settings import SECRET_SETTINGS, ProcessSettings
from worker.settings import SettingsError, load_settings


def test_the_defaults_are_the_limits_own_and_every_variable_is_read():
    assert ProcessSettings.from_environ({}).request_limits() == RequestLimits()
    settings = ProcessSettings.from_environ({
        "KVROUTE_MAX_BODY_BYTES": "4096", "KVROUTE_MAX_PROMPT_CHARS": "99",
        "KVROUTE_MAX_SEQUENCES_PER_REQUEST": "3", "KVROUTE_MAX_STREAMS_PER_TENANT": "2",
        "KVROUTE_PIN_MAX_NAMES_PER_TENANT": "5", "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT": "77",
        "KVROUTE_CACHE_DIR": "/tmp/kv", "KVROUTE_API_KEYS": "k=t",
        "KVROUTE_REQUIRE_API_KEYS": "1", "KVROUTE_ADMIN_KEY": "a",
        "KVROUTE_REQUIRE_ADMIN_KEY": "true"})
    assert settings.request_limits() == RequestLimits(max_body_bytes=4096, max_prompt_chars=99,
                                                      max_sequences=3)
    assert (settings.max_streams_per_tenant, settings.pin_max_names_per_tenant,
            settings.pin_max_blocks_per_tenant) == (2, 5, 77)
    assert str(settings.cache_root()) == "/tmp/kv"
    assert settings.api_keys.get_secret_value() == "k=t" and settings.require_api_keys
    assert settings.admin_key.get_secret_value() == "a" and settings.require_admin_key
    assert "k=t" not in repr(settings) and SECRET_SETTINGS == {"api_keys", "admin_key"}


def test_a_bad_value_is_named_with_its_variable():
    with pytest.raises(SettingsError, match=r"max_body_bytes = '0' \(from "
                                            r"\$KVROUTE_MAX_BODY_BYTES\)"):
        ProcessSettings.from_environ({"KVROUTE_MAX_BODY_BYTES": "0"})


def test_a_bad_secret_is_named_but_never_printed():
    class Keyed(BaseModel):
        key: SecretStr = Field(min_length=8)

    with pytest.raises(SettingsError) as err:
        load_settings(Keyed, {}, {"KVROUTE_KEY": "sk-sho"})
    assert "sk-sho" not in str(err.value) and "key = (hidden) (from $KVROUTE_KEY)" in str(
        err.value)


def test_the_replicas_get_the_process_settings_and_nothing_kubernetes_injected():
    environ = {"KVROUTE_MAX_BODY_BYTES": "4096", "KVROUTE_API_KEYS": "sk-secret=t",
               # a Service named kvroute: its service-link variables share the prefix
               "KVROUTE_PORT": "tcp://10.96.0.12:8000", "KVROUTE_SERVICE_HOST": "10.96.0.12",
               "KVROUTE_PORT_8000_TCP_ADDR": "10.96.0.12"}
    assert replica_env(ServeSettings(), environ) == {"KVROUTE_MAX_BODY_BYTES": "4096",
                                                     "KVROUTE_REQUIRE_API_KEYS": "1"}
    with pytest.raises(SettingsError, match="KVROUTE_MAX_PROMPT_CHARS"):  # fails the build
        replica_env(ServeSettings(), {"KVROUTE_MAX_PROMPT_CHARS": "many"})
