"""Two gateway processes by default (ingress routers, gateways, worker gateways): with one,
its failure or restart fails every POST until Serve brings it back. Built, not deployed."""

from router.serve.app import build_app
from router.serve.settings import ServeSettings


def test_two_ingress_routers_and_two_gateways_by_default(monkeypatch):
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
