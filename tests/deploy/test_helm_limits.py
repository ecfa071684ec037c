"""The chart's `limits` values (request limits and pin quotas) reach every Ray container as
the environment variables the gateway and the engine replicas read, and the schema refuses
a limit below 1."""

import pytest

from router.front.pin_admin import PinQuota
from worker.openai.limits import RequestLimits
from worker.openai.stream_slots import StreamSlots
from worker.process_settings import ProcessSettings

from .helm_chart import engine_group, head_template, render, template

LIMIT_ENV = {"maxBodyBytes": "KVROUTE_MAX_BODY_BYTES",
             "maxPromptChars": "KVROUTE_MAX_PROMPT_CHARS",
             "maxSequencesPerRequest": "KVROUTE_MAX_SEQUENCES_PER_REQUEST",
             "maxStreamsPerTenant": "KVROUTE_MAX_STREAMS_PER_TENANT",
             "pinMaxNamesPerTenant": "KVROUTE_PIN_MAX_NAMES_PER_TENANT",
             "pinMaxBlocksPerTenant": "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT"}

# The env the default `limits` render (every Ray container, before extraEnv).
DEFAULT_LIMITS_ENV = [{"name": "KVROUTE_MAX_BODY_BYTES", "value": "8388608"},
                      {"name": "KVROUTE_MAX_PROMPT_CHARS", "value": "1000000"},
                      {"name": "KVROUTE_MAX_SEQUENCES_PER_REQUEST", "value": "128"},
                      {"name": "KVROUTE_PIN_MAX_NAMES_PER_TENANT", "value": "16"},
                      {"name": "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT", "value": "1024"}]


def ray_container_envs(docs: list[dict]) -> list[dict[str, str]]:
    templates = [head_template(docs), engine_group(docs)["template"]]
    return [{e["name"]: e.get("value") for e in container.get("env", [])}
            for t in templates for container in t["spec"]["containers"]]


def test_the_defaults_are_the_servers_own_defaults(helm_bin):
    (head, engine) = ray_container_envs(render(helm_bin))
    for env in (head, engine):
        settings = ProcessSettings.from_environ(env)
        assert settings.request_limits() == RequestLimits()
        # no API keys: no stream cap
        assert StreamSlots.for_tenants(False, settings.max_streams_per_tenant) is None
        assert PinQuota.of(settings) == PinQuota()
        assert {e["name"]: e["value"] for e in DEFAULT_LIMITS_ENV}.items() <= env.items()


def test_set_limits_reach_every_ray_container_and_the_servers_read_them(helm_bin):
    values = {"maxBodyBytes": 1048576, "maxPromptChars": 50000, "maxSequencesPerRequest": 16,
              "maxStreamsPerTenant": 8,
              "pinMaxNamesPerTenant": 3, "pinMaxBlocksPerTenant": 200}
    docs = render(helm_bin, set_values=[f"limits.{k}={v}" for k, v in values.items()]
                  + ["apiKeys.enabled=true"])  # the stream cap is rendered only with keys
    for env in ray_container_envs(docs):
        assert {LIMIT_ENV[k]: env[LIMIT_ENV[k]] for k in values} == {
            LIMIT_ENV[k]: str(v) for k, v in values.items()}
        settings = ProcessSettings.from_environ(env)
        assert settings.request_limits() == RequestLimits(
            max_body_bytes=1048576, max_prompt_chars=50000, max_sequences=16)
        assert StreamSlots.for_tenants(True, settings.max_streams_per_tenant
                                       ).max_per_tenant == 8
        assert PinQuota.of(settings) == PinQuota(3, 200)


def test_extra_env_still_wins(helm_bin):
    docs = render(helm_bin, set_values=["extraEnv[0].name=KVROUTE_MAX_STREAMS_PER_TENANT",
                                        "extraEnv[0].value=5"])
    for container in (head_template(docs)["spec"]["containers"][0],):
        names = [e["name"] for e in container["env"]]
        last = max(i for i, n in enumerate(names) if n == "KVROUTE_MAX_STREAMS_PER_TENANT")
        assert str(container["env"][last]["value"]) == "5"  # --set makes it a number


@pytest.mark.parametrize("key", sorted(LIMIT_ENV))
def test_the_schema_refuses_a_limit_below_1(helm_bin, key):
    result = template(helm_bin, set_values=[f"limits.{key}=0"])
    assert result.returncode != 0 and key in result.stderr
