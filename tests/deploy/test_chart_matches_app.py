"""The chart's Serve config against the application it deploys: every arg is one
router.serve.settings.ServeSettings takes, every overridden deployment exists, the policy
list is the router's, and NOTES.txt names the model the way the engine serves it."""

import json

import pytest

from router.apps.external import ExternalGatewayReplica
from router.core.policies import POLICY_NAMES
from router.gateway.app import Gateway
from router.serve.engine_replica import EngineReplica
from router.serve.ingress_endpoint import IngressRouteEndpoint
from router.serve.serve_env import serve_env
from router.serve.settings import ServeSettings
from worker.settings import load_settings

from .helm_chart import CHART, VALUE_SETS, notes, render, serve_config


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_serve_args_are_accepted_by_the_app(helm_bin, value_set):
    (app,) = serve_config(render(helm_bin, VALUE_SETS[value_set]))["applications"]
    settings = load_settings(ServeSettings, app["args"], env={})
    assert settings.engine_config().engine == app["args"]["engine"]


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_overridden_deployments_exist(helm_bin, value_set):
    (app,) = serve_config(render(helm_bin, VALUE_SETS[value_set]))["applications"]
    assert {d["name"] for d in app["deployments"]} <= {Gateway.name, EngineReplica.name,
                                                       IngressRouteEndpoint.name,
                                                       ExternalGatewayReplica.name}


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_every_ray_container_has_the_serve_env_of_its_ingress(helm_bin, value_set):
    docs = render(helm_bin, VALUE_SETS[value_set])
    (app,) = serve_config(docs)["applications"]
    want = serve_env(app["args"]["ingress"], local=False, environ={},
                     routers_per_node=app["args"]["gateways"])
    (service,) = [d for d in docs if d["kind"] == "RayService"]
    cluster = service["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]] + [
        group["template"] for group in cluster["workerGroupSpecs"]]
    for pod in pods:
        for container in pod["spec"]["containers"]:
            env = {e["name"]: e.get("value") for e in container["env"]}
            assert {name: env[name] for name in env if name.startswith("RAY_SERVE_")} == want


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_notes_name_the_served_model(helm_bin, value_set):
    (app,) = serve_config(render(helm_bin, VALUE_SETS[value_set]))["applications"]
    settings = ServeSettings(model=app["args"]["model"], workers=app["args"].get("workers", ()),
                             served_model_name=app["args"].get("served_model_name"))
    # with workers, the model is the name they serve, verbatim
    served = (settings.model if settings.workers
              else settings.engine_config().served_model_name)
    assert f'"model": "{served}"' in notes(helm_bin, VALUE_SETS[value_set])


def test_schema_lists_the_router_policies():
    schema = json.loads((CHART / "values.schema.json").read_text())
    assert tuple(schema["properties"]["routing"]["properties"]["policy"]["enum"]) == (
        POLICY_NAMES)
