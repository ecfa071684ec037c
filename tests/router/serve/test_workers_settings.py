"""The external-worker settings: `workers` from a flag, a variable or a Serve config list,
and the application they build (gateway replicas only, listening themselves)."""

import pytest
from ray.serve._private.api import call_user_app_builder_with_args_if_necessary
from ray.serve.scripts import convert_args_to_dict

from router.apps.build import build_app
from router.cli import main
from router.serve.settings import ServeSettings
from worker.settings import SettingsError, load_settings


def test_workers_come_as_one_comma_separated_string_or_a_list():
    env = {"KVROUTE_WORKERS": "http://A:1/v1, http://b:2#kv_events=tcp://b:5557"}
    settings = load_settings(ServeSettings, {}, env)
    assert settings.workers == ("http://a:1", "http://b:2#kv_events=tcp://b:5557")
    listed = load_settings(ServeSettings, {"workers": ["http://c:3"]}, env)
    assert listed.workers == ("http://c:3",)  # explicit wins over the variable


@pytest.mark.parametrize("workers, message", [
    ("http://a:1,http://a:1/v1", "http://a:1 is listed twice"),
    ("a:1", "must be http://host"),
    ("http://a:1#kv_events=udp://a:2", "is not a ZMQ endpoint"),
])
def test_a_bad_worker_is_a_settings_error_naming_it(workers, message):
    with pytest.raises(SettingsError, match=f"workers = .*{message}"):
        load_settings(ServeSettings, {"workers": workers}, {})


def test_the_workers_app_is_gateway_replicas_listening_on_the_launch_port():
    args = convert_args_to_dict(("workers=http://w1:8000,http://w2:8000", "gateways=2",
                                 "model=tiny", "policy=round_robin"))
    app = call_user_app_builder_with_args_if_necessary(build_app, args)
    gateway = app._bound_deployment
    assert gateway.name == "WorkerGateway" and gateway.num_replicas == 2
    config, http = gateway.init_args
    assert [w.url for w in config.worker_set.workers] == ["http://w1:8000", "http://w2:8000"]
    assert (config.model, config.tokenizer, config.router.policy) == ("tiny", "tiny",
                                                                      "round_robin")
    assert (http.host, http.port) == ("127.0.0.1", 8000)


def test_kvroute_serve_names_an_unreachable_worker_and_starts_nothing(capsys):
    assert main(["serve", "--workers", "http://127.0.0.1:1", "--model", "tiny"]) == 2
    err = capsys.readouterr().err
    assert "worker http://127.0.0.1:1 is unreachable" in err


def test_kvroute_serve_needs_the_workers_tokenizer(capsys, tmp_path):
    assert main(["serve", "--workers", "http://127.0.0.1:1", "--model", "llama",
                 "--tokenizer", str(tmp_path / "nowhere")]) == 2
    assert "needs the workers' tokenizer" in capsys.readouterr().err


def test_the_workers_app_carries_absolute_key_paths(tmp_path, monkeypatch):
    """Only the key files' paths travel to the gateway replicas, whose working directory
    need not be the builder's: a relative path is made absolute where the app is built."""
    (tmp_path / "keys").write_text("k1 tenant-a\n")
    (tmp_path / "admin").write_text("secret\n")
    monkeypatch.chdir(tmp_path)
    args = convert_args_to_dict(("workers=http://w1:8000", "model=tiny",
                                 "api_keys_file=keys", "admin_key_file=admin"))
    app = call_user_app_builder_with_args_if_necessary(build_app, args)
    config, _ = app._bound_deployment.init_args
    assert config.api_keys_file == str(tmp_path / "keys")
    assert config.admin_key_file == str(tmp_path / "admin")
