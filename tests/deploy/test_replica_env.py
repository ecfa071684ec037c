"""On a joined cluster a replica's environment is its node's, not the driver's: the app
builder hands every deployment the `KVROUTE_*` variables the replicas read (limits, quotas)
in its runtime_env, but not key values (Ray logs every runtime_env), and a replica built
expecting keys that finds none refuses to start. Built, not deployed: no Ray needed."""

from pathlib import Path

import pytest

from router.apps.build import build_app
from router.front.admin_key import load_admin_key
from router.front.tenants import load_api_keys
from worker.process_settings import ProcessSettings
from worker.settings import env_name

from .helm_chart import engine_group, head_template, render

ROOT = Path(__file__).resolve().parents[2]

# One value for each variable a replica reads (its process settings: the test below).
REPLICA_VALUES = {
    "KVROUTE_API_KEYS": "sk-driver-only=tenant-a",
    "KVROUTE_ADMIN_KEY": "admin-driver-only",
    "KVROUTE_MAX_BODY_BYTES": "4096",
    "KVROUTE_MAX_PROMPT_CHARS": "1234",
    "KVROUTE_MAX_SEQUENCES_PER_REQUEST": "7",
    "KVROUTE_MAX_STREAMS_PER_TENANT": "3",
    "KVROUTE_PIN_MAX_NAMES_PER_TENANT": "2",
    "KVROUTE_PIN_MAX_BLOCKS_PER_TENANT": "64",
    "KVROUTE_CACHE_DIR": "/var/cache/kvroute",
}
REQUIRED = {"KVROUTE_REQUIRE_API_KEYS": "1", "KVROUTE_REQUIRE_ADMIN_KEY": "1"}
SECRETS = {"KVROUTE_API_KEYS", "KVROUTE_ADMIN_KEY"}
FORWARDED = {k: v for k, v in REPLICA_VALUES.items() if k not in SECRETS}


def _replica_read_variables() -> set[str]:
    """Every `KVROUTE_*` name a replica reads: its process settings' (the only ones a
    module but the settings loader may read, tests/worker/test_settings_sources.py)."""
    return {env_name(name) for name in ProcessSettings.model_fields} - set(REQUIRED)


def env(variables: dict) -> ProcessSettings:
    return ProcessSettings.from_environ(variables)


def _walk(app):
    """Every deployment of a built application: the ingress, what it binds, and with
    ingress direct the ingress request router attached to it."""
    seen, todo = [], [app._bound_deployment]
    router = getattr(app, "_ingress_request_router", None)
    if router is not None:
        todo.append(router._bound_deployment)
    while todo:
        bound = todo.pop()
        if any(bound.name == other.name for other in seen):
            continue  # the ingress request router binds the engine deployment too
        seen.append(bound)
        for arg in bound.init_args:
            if hasattr(arg, "_bound_deployment"):
                todo.append(arg._bound_deployment)
    return seen


def _env_vars(deployment) -> dict[str, str]:
    return deployment.ray_actor_options.get("runtime_env", {}).get("env_vars", {})


def test_every_variable_a_replica_reads_is_in_this_test():
    assert _replica_read_variables() == set(REPLICA_VALUES)


@pytest.mark.parametrize("args", [
    {"ingress": "direct", "engine": "sim", "replicas": 2},
    {"ingress": "gateway", "engine": "sim", "replicas": 2},
    {"workers": "http://10.0.0.5:8000", "model": "m", "tokenizer": "tiny"},
], ids=["direct", "gateway", "workers"])
def test_the_drivers_limits_and_key_requirement_reach_every_deployment(monkeypatch, args):
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    for name, value in REPLICA_VALUES.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("KVROUTE_REPLICAS", "2")  # a setting: resolved here, not forwarded
    deployments = _walk(build_app(args))
    assert len(deployments) == (1 if "workers" in args else 2)
    for deployment in deployments:
        assert _env_vars(deployment) == {**FORWARDED, **REQUIRED}, deployment.name
        assert "driver-only" not in repr(deployment.ray_actor_options)  # no key value
        assert deployment.ray_actor_options["num_cpus"] >= 0  # the code's options kept


def test_no_keys_in_the_driver_no_requirement(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    for name in [*REPLICA_VALUES, *REQUIRED]:
        monkeypatch.delenv(name, raising=False)
    for deployment in _walk(build_app({"ingress": "direct", "engine": "sim"})):
        assert "runtime_env" not in deployment.ray_actor_options
    monkeypatch.setenv("KVROUTE_MAX_BODY_BYTES", "4096")
    for deployment in _walk(build_app({"ingress": "direct", "engine": "sim",
                                       "api_keys_file": "/etc/kvroute/keys"})):
        assert _env_vars(deployment) == {"KVROUTE_MAX_BODY_BYTES": "4096",
                                         "KVROUTE_REQUIRE_API_KEYS": "1"}


def test_a_replica_expecting_keys_that_finds_none_refuses_to_start(tmp_path):
    empty = tmp_path / "keys"
    empty.write_text("# the Secret was created empty\n")
    require = {"KVROUTE_REQUIRE_API_KEYS": "1"}
    with pytest.raises(ValueError, match="refusing to serve unauthenticated"):
        load_api_keys(None, env(require))
    with pytest.raises(ValueError, match="refusing to serve unauthenticated"):
        load_api_keys(str(empty), env({**require, "KVROUTE_API_KEYS": ""}))
    assert load_api_keys(None, env({**require, "KVROUTE_API_KEYS": "k=t"})) == {"k": "t"}
    assert load_api_keys(str(empty), env({})) == {}  # not required: an open server, as before


def test_a_replica_expecting_an_admin_key_that_finds_none_refuses_to_start():
    with pytest.raises(ValueError, match="refusing to start"):
        load_admin_key(None, env({"KVROUTE_REQUIRE_ADMIN_KEY": "1", "KVROUTE_ADMIN_KEY": " "}))
    assert load_admin_key(None, env({"KVROUTE_REQUIRE_ADMIN_KEY": "1",
                                     "KVROUTE_ADMIN_KEY": "a"})) == "a"
    assert load_admin_key(None, env({})) is None


def test_the_chart_tells_every_ray_container_that_keys_are_required(helm_bin):
    def envs(docs):
        return [{e["name"]: e.get("value") for e in t["spec"]["containers"][0]["env"]}
                for t in (head_template(docs), engine_group(docs)["template"])]

    for env in envs(render(helm_bin)):
        assert not set(REQUIRED) & set(env)  # no keys: an open server, as before
    on = render(helm_bin, set_values=["apiKeys.enabled=true", "adminKey.enabled=true"])
    for env in envs(on):
        assert {name: env[name] for name in REQUIRED} == REQUIRED
        with pytest.raises(ValueError):  # the Secret's key file empty: refuses to start
            load_api_keys(None, ProcessSettings.from_environ(env))


def _key_config(deployment):
    """The config a deployment's replicas load their keys with (GatewayConfig,
    EngineHTTPConfig, IngressRouteEndpointConfig), or None for one that checks no key."""
    found = [arg for arg in deployment.init_args if hasattr(arg, "api_keys_file")]
    return found[0] if found else None


@pytest.mark.parametrize("ingress", ["direct", "gateway"])
def test_key_files_reach_the_replicas_as_paths_and_the_replicas_find_the_keys(
        monkeypatch, tmp_path, ingress):
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    for name in [*REPLICA_VALUES, *REQUIRED]:
        monkeypatch.delenv(name, raising=False)
    (tmp_path / "keys").write_text("sk-from-file tenant-a\n")
    (tmp_path / "admin").write_text("admin-from-file\n")
    monkeypatch.chdir(tmp_path)  # relative paths: the replicas get them made absolute
    deployments = _walk(build_app({"ingress": ingress, "engine": "sim",
                                   "api_keys_file": "keys", "admin_key_file": "admin"}))
    monkeypatch.chdir(ROOT)  # a replica's working directory is not the builder's
    pin_checkers = 0
    for deployment in deployments:
        env = _env_vars(deployment)
        assert env == REQUIRED, deployment.name
        assert "from-file" not in repr(deployment.ray_actor_options)  # no key value
        config = _key_config(deployment)
        if config is None:  # the engine behind the gateway: it checks no key
            continue
        assert "from-file" not in repr(config)
        assert config.api_keys_file == str(tmp_path / "keys")
        assert load_api_keys(config.api_keys_file, ProcessSettings.from_environ(env)) == {
            "sk-from-file": "tenant-a"}
        if hasattr(config, "admin_key_file"):  # builds a PinAdmin: pins need the admin key
            pin_checkers += 1
            assert config.admin_key_file == str(tmp_path / "admin")
            assert load_admin_key(config.admin_key_file,
                                  ProcessSettings.from_environ(env)) == "admin-from-file"
    assert pin_checkers == 1  # the gateway, or with ingress direct the engine replicas
