"""The serve settings from every source: `serve run key=value` (Ray Serve's own parsing and
builder call), KVROUTE_* variables, `kvroute serve` flags; precedence and errors."""

import math

import pytest
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.scripts import convert_args_to_dict

from router.apps.build import build_app
from router.cli import _parser, local_cpus_per_rank, main
from router.serve.settings import LaunchSettings, ServeSettings
from worker.settings import SettingsError, env_name, flag_name, given_flags, load_settings


def _deployments(app):
    """(gateway, engine) deployments of a built (not deployed) kvroute application."""
    gateway = app._bound_deployment
    return gateway, gateway.init_args[0]._bound_deployment


def test_serve_run_key_value_strings_are_coerced():
    args = convert_args_to_dict(("replicas=3", "tp=2", "approximate=true", "engine=sim",
                                 "imbalance_threshold=inf", "gateways=2", "ingress=gateway"))
    assert args["replicas"] == "3"  # what Serve's CLI hands the builder: strings
    app = call_user_app_builder_with_args_if_necessary(build_app, args)
    gateway, engine = _deployments(app)
    assert (gateway.num_replicas, engine.num_replicas) == (2, 3)
    (engine_config,) = engine.init_args
    assert (engine_config.tp, engine_config.engine) == (2, "sim")
    assert len(engine._replica_config.placement_group_bundles) == 2
    router = engine._deployment_config.request_router_config.request_router_kwargs["router"]
    assert router["approximate"] is True and router["imbalance_threshold"] == math.inf


def test_build_app_rejects_a_bad_arg_naming_it():
    with pytest.raises(SettingsError, match=r"replicas = 'two' \(from arg replicas\)"):
        build_app({"replicas": "two"})
    with pytest.raises(SettingsError, match="unknown kvroute setting.* executor; known: model"):
        build_app({"executor": "sim"})


def test_env_overrides_defaults_and_explicit_overrides_env():
    env = {env_name("replicas"): "4", env_name("policy"): "round_robin", "KVROUTE_OTHER": "x"}
    settings = load_settings(ServeSettings, {"policy": "least_load"}, env)
    assert (settings.replicas, settings.policy, settings.tp) == (4, "least_load", 1)
    # A Serve config's null (or `key=`) is "not given": the variable still applies.
    assert load_settings(ServeSettings, {"replicas": None}, env).replicas == 4
    assert load_settings(ServeSettings, {}, {}) == ServeSettings()


def test_bad_env_value_names_the_variable():
    with pytest.raises(SettingsError,
                       match=r"tp = '0' \(from \$KVROUTE_TP\): .*greater than or equal to 1"):
        load_settings(ServeSettings, {}, {"KVROUTE_TP": "0"})


def test_every_bad_setting_is_named_in_one_error():
    with pytest.raises(SettingsError) as err:
        load_settings(ServeSettings, {"num_blocks": -1, "host_cost_fraction": 2}, {})
    assert "num_blocks = -1" in str(err.value)
    assert "host_cost_fraction = 2" in str(err.value)


def test_component_checks_run_at_load():
    with pytest.raises(SettingsError, match=r"sim_preset = .a100. \(from arg sim_preset\)"):
        load_settings(ServeSettings, {"sim_preset": "a100"}, {})
    # RouterConfig's own check (finite), beyond the field's bound (>= 0).
    with pytest.raises(SettingsError, match="RouterConfig: load_weight must be finite"):
        load_settings(ServeSettings, {"load_weight": "inf"}, {})
    settings = load_settings(ServeSettings, {"num_blocks": 10, "num_host_blocks": 5}, {})
    assert settings.router_args()["approx_capacity_blocks"] == 15


def test_every_setting_has_a_flag_and_only_given_flags_count():
    parser = _parser()
    ns = parser.parse_args(["serve", "--num-host-blocks", "64", "--no-approximate",
                            "--port", "9000"])
    assert given_flags(ns, ServeSettings) == {"num_host_blocks": "64", "approximate": False}
    assert given_flags(ns, LaunchSettings) == {"port": "9000"}
    settings = load_settings(ServeSettings, given_flags(ns, ServeSettings),
                             {"KVROUTE_APPROXIMATE": "1", "KVROUTE_REPLICAS": "3"}, flag_name)
    assert (settings.num_host_blocks, settings.approximate, settings.replicas) == (64, False, 3)
    help_text = parser._subparsers._group_actions[0].choices["serve"].format_help()
    for name in [*ServeSettings.model_fields, *LaunchSettings.model_fields]:
        assert flag_name(name) in help_text
        assert (env_name(name) in help_text) == (name != "port")  # the port: a flag only


def test_kubernetes_service_link_variable_is_never_read_as_the_port():
    # A Service named kvroute puts KVROUTE_PORT=tcp://... into every pod of its namespace.
    launch = load_settings(LaunchSettings, {}, {"KVROUTE_PORT": "tcp://10.96.0.12:8000",
                                                "KVROUTE_HOST": "0.0.0.0"})
    assert (launch.host, launch.port) == ("0.0.0.0", 8000)
    assert load_settings(LaunchSettings, {"port": "9000"}, {}, flag_name).port == 9000


def test_cli_rejects_a_bad_flag_before_starting_anything(capsys):
    assert main(["serve", "--replicas", "0"]) == 2
    err = capsys.readouterr().err
    assert "replicas = '0' (from --replicas)" in err


def test_cli_rejects_a_bad_process_setting_before_starting_anything(capsys, monkeypatch):
    # read by every replica from its environment: checked before Ray starts, not in each
    monkeypatch.setenv("KVROUTE_MAX_BODY_BYTES", "zero")
    assert main(["serve", "--engine", "sim", "--model", "tiny"]) == 2
    assert "max_body_bytes = 'zero' (from $KVROUTE_MAX_BODY_BYTES)" in capsys.readouterr().err


def test_cli_shares_local_cpus_unless_set():
    settings = ServeSettings(replicas=2, tp=2)
    assert local_cpus_per_rank(settings, num_cpus=2).cpus_per_rank == 0.5
    assert local_cpus_per_rank(settings, num_cpus=None).cpus_per_rank == 1.0
    pinned = ServeSettings(replicas=2, tp=2, cpus_per_rank=0.25)
    assert local_cpus_per_rank(pinned, num_cpus=2).cpus_per_rank == 0.25


def test_served_model_name_reaches_the_engine_the_gateway_and_the_router():
    app = build_app({"served_model_name": "llama-prod", "engine": "sim", "replicas": 1,
                     "ingress": "gateway"})
    gateway, engine = _deployments(app)
    (engine_config,) = engine.init_args
    assert engine_config.served_model_name == "llama-prod"
    assert gateway.init_args[1].served_model_name == "llama-prod"
    assert engine._deployment_config.request_router_config.request_router_kwargs[
        "model"] == "llama-prod"
    assert load_settings(ServeSettings, {}, env={}).engine_config().served_model_name == "smollm2"


def test_served_model_name_is_refused_with_workers():
    with pytest.raises(SettingsError, match="with workers, model is the name they serve"):
        load_settings(ServeSettings, {"served_model_name": "x", "model": "x",
                                      "workers": "http://w0:8000"}, env={})


def test_ingress_is_direct_by_default_and_the_worker_gateway_with_workers():
    assert load_settings(ServeSettings, {}, env={}).ingress == "direct"
    workers = load_settings(ServeSettings, {"model": "m", "workers": "http://w0:8000"}, env={})
    assert workers.ingress == "gateway"
    with pytest.raises(SettingsError, match="with workers the external gateway is the ingress"):
        load_settings(ServeSettings, {"model": "m", "workers": "http://w0:8000",
                                      "ingress": "direct"}, env={})


def test_pooled_bound_settings_reach_the_request_routers():
    app = build_app({"engine": "sim", "replicas": 1, "ingress": "gateway",
                     "pooled_sample_rate": "0.25", "pooled_window_s": "300"})
    _, engine = _deployments(app)
    kwargs = engine._deployment_config.request_router_config.request_router_kwargs
    assert kwargs["bound"] == {"sample_rate": 0.25, "recent_window_s": 300.0}
    with pytest.raises(SettingsError, match="pooled_sample_rate"):
        load_settings(ServeSettings, {"pooled_sample_rate": "1.5"}, env={})


def test_continuation_affinity_reaches_the_request_routers_and_the_worker_gateway():
    app = build_app({"engine": "sim", "replicas": 1, "ingress": "gateway",
                     "continuation_affinity": "true"})
    _, engine = _deployments(app)
    kwargs = engine._deployment_config.request_router_config.request_router_kwargs
    assert kwargs["router"]["continuation_affinity"] is True
    assert ServeSettings(workers=["http://w:1"]).router_args()["continuation_affinity"] is False
