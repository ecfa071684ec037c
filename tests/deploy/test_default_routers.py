"""Two gateway processes by default (ingress routers, gateways, external gateways), so one's
restart fails no POST; they share their pending marks (router/cluster/shared_marks.py);
`gateways` asks for another number. Built, not deployed."""

from router.apps.build import build_app
from router.serve.serve_env import serve_env
from router.serve.settings import ServeSettings

from .helm_chart import head_template, render


def test_two_gateways_by_default_and_another_number_on_request(monkeypatch):
    monkeypatch.setenv("RAY_SERVE_ENABLE_HA_PROXY", "1")
    monkeypatch.delenv("KVROUTE_GATEWAYS", raising=False)
    assert ServeSettings().gateways == 2
    direct = build_app({"engine": "sim"})
    assert direct._ingress_request_router._bound_deployment.num_replicas == 2
    assert build_app({"engine": "sim", "ingress": "gateway"})._bound_deployment.num_replicas == 2
    workers = build_app({"workers": "http://10.0.0.5:8000", "model": "m", "tokenizer": "tiny"})
    assert workers._bound_deployment.num_replicas == 2
    one = build_app({"engine": "sim", "gateways": 1})
    assert one._ingress_request_router._bound_deployment.num_replicas == 1


def test_serve_runs_the_routers_per_node_from_its_environment_not_num_replicas(helm_bin):
    # Ray Serve 2.60 runs RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE ingress request routers
    # on each proxy node and ignores the deployment's num_replicas: `gateways` must reach it.
    env = serve_env("direct", local=False, environ={}, routers_per_node=2)
    assert env["RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE"] == "2"
    assert serve_env("direct", local=False, routers_per_node=2, environ={
        "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE": "3"})[
            "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE"] == "3"  # the user's wins
    assert "RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE" not in serve_env(
        "gateway", local=False, environ={}, routers_per_node=2)
    env = {e["name"]: e.get("value")
           for e in head_template(render(helm_bin))["spec"]["containers"][0]["env"]}
    assert env["RAY_SERVE_INGRESS_ROUTER_REPLICAS_PER_NODE"] == "2"
