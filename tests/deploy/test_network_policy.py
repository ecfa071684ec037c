"""The chart's NetworkPolicy, evaluated as Kubernetes does for an ingress policy: a
connection to a selected pod is allowed when one rule's ports and one of its peers match.
Only the release's own Ray pods reach the engine replicas' and ingress routers' own ports
(30000+ HTTP, 40000+ gRPC: they trust the route header) and Ray's ports (which carry the KV
events); clients reach the serve port, Prometheus its /metrics, the KubeRay operator the
dashboard. Its schema validity is test_manifests_valid.py's (every built-in kind)."""

from dataclasses import dataclass, field

import pytest

from .helm_chart import NAMESPACE, VALUE_SETS, engine_group, head_template, one, render

SERVE_PORT = 8000
# The engine replicas' and ingress routers' own HTTP and gRPC ports, Ray's GCS, client,
# dashboard agent, a worker's gRPC port, HAProxy's stats and metrics, the Ray dashboard.
RAY_CLUSTER_PORTS = [30000, 30001, 40000, 6379, 10001, 52365, 10002, 8404, 9101, 8265]


@dataclass(frozen=True)
class Peer:
    namespace: str
    labels: dict = field(default_factory=dict)
    namespace_labels: dict = field(default_factory=dict)


def _selects(selector: dict, labels: dict) -> bool:
    assert set(selector) <= {"matchLabels"}, selector  # what this evaluator implements
    return all(labels.get(k) == v for k, v in selector.get("matchLabels", {}).items())


def _peer_matches(rule_peer: dict, peer: Peer) -> bool:
    assert set(rule_peer) <= {"podSelector", "namespaceSelector"}, rule_peer
    if "namespaceSelector" in rule_peer:
        if not _selects(rule_peer["namespaceSelector"], peer.namespace_labels):
            return False
    elif peer.namespace != NAMESPACE:  # a podSelector alone: the policy's namespace
        return False
    return _selects(rule_peer.get("podSelector", {}), peer.labels)


def allowed(policy: dict, pod_labels: dict, peer: Peer, port: int) -> bool:
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    if not _selects(spec["podSelector"], pod_labels):
        return True  # not a pod this policy isolates
    for rule in spec.get("ingress", []):
        ports_ok = "ports" not in rule or any(p["port"] == port and p["protocol"] == "TCP"
                                              for p in rule["ports"])
        peers_ok = "from" not in rule or any(_peer_matches(p, peer) for p in rule["from"])
        if ports_ok and peers_ok:
            return True
    return False


def _pods(docs):
    return {"head": head_template(docs)["metadata"]["labels"],
            "engine": engine_group(docs)["template"]["metadata"]["labels"]}


RELEASE_POD = Peer(NAMESPACE, {"app.kubernetes.io/name": "kvroute",
                               "app.kubernetes.io/instance": "demo"})
CLIENT = Peer("apps", {"app": "chat-frontend"}, {"kubernetes.io/metadata.name": "apps"})
ANOTHER_RELEASE = Peer(NAMESPACE, {"app.kubernetes.io/name": "kvroute",
                                   "app.kubernetes.io/instance": "other"})
PROMETHEUS = Peer("monitoring", {"app.kubernetes.io/name": "prometheus"},
                  {"kubernetes.io/metadata.name": "monitoring"})
OPERATOR = Peer("ray-system", {"app.kubernetes.io/name": "kuberay-operator"},
                {"kubernetes.io/metadata.name": "ray-system"})


@pytest.mark.parametrize("value_set", ["default", "gateway", "workers", "autoscaling"])
def test_only_the_release_reaches_the_replicas_routers_and_ray(helm_bin, value_set):
    docs = render(helm_bin, VALUE_SETS[value_set])
    policy = one(docs, "NetworkPolicy")
    for pod, labels in _pods(docs).items():
        for port in RAY_CLUSTER_PORTS:
            assert allowed(policy, labels, RELEASE_POD, port), (pod, port)
            for outsider in (CLIENT, ANOTHER_RELEASE, PROMETHEUS):
                assert not allowed(policy, labels, outsider, port), (pod, port, outsider)
        for peer in (RELEASE_POD, CLIENT, PROMETHEUS):
            assert allowed(policy, labels, peer, SERVE_PORT), (pod, peer)
        assert allowed(policy, labels, OPERATOR, 8265) and allowed(policy, labels, OPERATOR,
                                                                   52365)
        assert not allowed(policy, labels, OPERATOR, 30000)


def test_prometheus_scrapes_the_port_the_pod_monitor_names(helm_bin):
    docs = render(helm_bin, set_values=["networkPolicy.clients[0].namespaceSelector"
                                        ".matchLabels.team=chat"])
    policy = one(docs, "NetworkPolicy")
    (endpoint,) = one(docs, "PodMonitor")["spec"]["podMetricsEndpoints"]
    for pod in (head_template(docs), engine_group(docs)["template"]):
        (container,) = pod["spec"]["containers"]
        (port,) = [p["containerPort"] for p in container["ports"]
                   if p["name"] == endpoint["port"]]
        labels = pod["metadata"]["labels"]
        assert allowed(policy, labels, PROMETHEUS, port)
        # `clients` set: the serve port from them only (and Prometheus, the release)
        assert not allowed(policy, labels, CLIENT, port)
        team = Peer("chat", {}, {"team": "chat"})
        assert allowed(policy, labels, team, port) and not allowed(policy, labels, team, 30000)


def test_the_scraper_and_operator_selectors_are_values(helm_bin):
    docs = render(helm_bin, set_values=[
        "networkPolicy.clients[0].namespaceSelector.matchLabels.team=chat",
        "networkPolicy.prometheus.namespaceSelector.matchLabels.role=observability",
        "networkPolicy.prometheus.podSelector.matchLabels.app\\.kubernetes\\.io/name=null",
        "networkPolicy.prometheus.podSelector.matchLabels.app=vmagent",
        "networkPolicy.kuberayOperator.namespaceSelector.matchLabels.role=platform"])
    policy = one(docs, "NetworkPolicy")
    labels = _pods(docs)["engine"]
    vmagent = Peer("obs", {"app": "vmagent"}, {"role": "observability"})
    assert allowed(policy, labels, vmagent, SERVE_PORT)
    assert not allowed(policy, labels, Peer("apps", {"app": "vmagent"}, {}), SERVE_PORT)
    assert not allowed(policy, labels, PROMETHEUS, SERVE_PORT)
    assert not allowed(policy, labels, OPERATOR, 8265)  # not in a `role: platform` namespace
    assert allowed(policy, labels, Peer("ops", OPERATOR.labels, {"role": "platform"}), 8265)


def test_extra_rules_and_disabling(helm_bin):
    docs = render(helm_bin, set_values=[
        "networkPolicy.extraIngress[0].ports[0].port=10001",
        "networkPolicy.extraIngress[0].ports[0].protocol=TCP",
        "networkPolicy.extraIngress[0].from[0].namespaceSelector.matchLabels.team=ops"])
    policy = one(docs, "NetworkPolicy")
    labels = _pods(docs)["head"]
    assert allowed(policy, labels, Peer("ops", {}, {"team": "ops"}), 10001)
    assert not allowed(policy, labels, Peer("ops", {}, {"team": "ops"}), 30000)
    off = render(helm_bin, set_values=["networkPolicy.enabled=false"])
    assert "NetworkPolicy" not in {doc["kind"] for doc in off}
