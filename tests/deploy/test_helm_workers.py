"""The chart in front of external workers: no engine pods, the external gateway on the head
listening on the gateway port itself (no Serve proxy), the admin key from a Secret."""

from router.apps.build import build_app
from router.serve.settings import LaunchSettings, ServeSettings
from worker.settings import load_settings

from .helm_chart import engine_group, head_template, render, serve_config, template
from .test_helm_limits import DEFAULT_LIMITS_ENV


def test_workers_deploy_the_worker_gateway_and_no_engine(helm_bin):
    docs = render(helm_bin, ["workers.yaml"])
    config = serve_config(docs)
    assert config["proxy_location"] == "Disabled"
    (app,) = config["applications"]
    assert "route_prefix" not in app
    assert app["runtime_env"]["env_vars"] == {"KVROUTE_HOST": "0.0.0.0"}
    # the gateways listen on the port setting's default, the chart's gateway port
    assert LaunchSettings().port == config["http_options"]["port"] == 8000
    assert [d["name"] for d in app["deployments"]] == ["WorkerGateway"]
    args = app["args"]
    assert (args["model"], args["tokenizer"]) == ("tiny", "tiny")
    assert len(args["workers"]) == 2
    group = engine_group(docs)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (0, 0, 0)
    (head,) = head_template(docs)["spec"]["containers"]
    env = [e for e in head["env"] if not e["name"].startswith("RAY_SERVE_")
           and e not in DEFAULT_LIMITS_ENV]
    assert env == [{"name": "KVROUTE_ADMIN_KEY",
                    "valueFrom": {"secretKeyRef": {"name": "kvroute-admin", "key": "key"}}},
                   {"name": "KVROUTE_REQUIRE_ADMIN_KEY", "value": "1"}]


def test_the_args_build_the_worker_gateway_app(helm_bin, monkeypatch):
    (app,) = serve_config(render(helm_bin, ["workers.yaml"]))["applications"]
    for name, value in app["runtime_env"]["env_vars"].items():
        monkeypatch.setenv(name, value)
    settings = load_settings(ServeSettings, app["args"], env={})
    assert settings.workers[0].endswith("#kv_events=tcp://vllm-0.vllm:5557"
                                        "&kv_replay=tcp://vllm-0.vllm:5558")
    built = build_app(app["args"])._bound_deployment
    config, http = built.init_args
    assert built.name == "WorkerGateway"
    assert (http.host, http.port) == ("0.0.0.0", 8000)
    assert [w.url for w in config.worker_set.workers] == ["http://vllm-0.vllm:8000",
                                                          "http://vllm-1.vllm:8000"]


def test_a_worker_that_is_no_url_fails_the_render(helm_bin):
    result = template(helm_bin, set_values=["workers[0]=vllm-0:8000"])
    assert result.returncode != 0 and "/workers/0" in result.stderr
