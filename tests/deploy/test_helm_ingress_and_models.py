"""The chart's ingress, upgrade, model-source and pod values rendered by the real helm: a
Hugging Face repo id on a cache volume, Ingress and HTTPRoute to the serve Service, the
incremental upgrade strategy, where the gateway processes run, and bad values."""

import pytest

from .helm_chart import (
    VALUE_SETS,
    engine_group,
    head_template,
    notes,
    one,
    render,
    serve_config,
    template,
)
from .test_helm_limits import DEFAULT_LIMITS_ENV


def container(pod_template: dict) -> dict:
    (only,) = pod_template["spec"]["containers"]
    return only


def test_huggingface_model_ingress_route_and_pod_settings(helm_bin):
    docs = render(helm_bin, VALUE_SETS["huggingface"])
    args = serve_config(docs)["applications"][0]["args"]
    assert (args["model"], args["served_model_name"]) == (
        "meta-llama/Llama-3.1-8B-Instruct@main", "llama-3.1-8b")
    cache_volume = {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}}
    cache_mount = {"name": "hf-cache", "mountPath": "/var/cache/huggingface"}
    env = [{"name": "HF_HUB_CACHE", "value": "/var/cache/huggingface"},
           {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf-token",
                                                               "key": "token"}}},
           *DEFAULT_LIMITS_ENV,  # the chart's `limits`, then extraEnv (last: it wins)
           {"name": "NCCL_DEBUG", "value": "WARN"}]
    for pod in (head_template(docs), engine_group(docs)["template"]):
        assert cache_volume in pod["spec"]["volumes"]
        assert cache_mount in container(pod)["volumeMounts"]
        assert [e for e in container(pod)["env"] if not e["name"].startswith("RAY_")] == env
        assert container(pod)["envFrom"] == [{"secretRef": {"name": "llm-env"}}]
        assert container(pod)["securityContext"] == {"allowPrivilegeEscalation": False}
        assert pod["spec"]["securityContext"] == {"fsGroup": 1000}
        assert pod["metadata"]["annotations"] == {
            "cluster-autoscaler.kubernetes.io/safe-to-evict": "false"}
    assert head_template(docs)["spec"]["priorityClassName"] == "llm-control"
    engine_pod = engine_group(docs)["template"]["spec"]
    assert engine_pod["priorityClassName"] == "llm-serving"
    assert list(engine_pod["affinity"]) == ["podAntiAffinity"]
    assert "affinity" not in head_template(docs)["spec"]
    assert one(docs, "RayService")["spec"]["excludeHeadPodFromServeSvc"] is True
    backend = {"service": {"name": "demo-kvroute", "port": {"number": 8000}}}
    ingress = one(docs, "Ingress")["spec"]
    assert ingress["ingressClassName"] == "nginx"
    assert ingress["tls"] == [{"secretName": "llm-tls", "hosts": ["llm.example.com"]}]
    assert ingress["rules"] == [{"host": "llm.example.com", "http": {"paths": [
        {"path": "/v1", "pathType": "Prefix", "backend": backend}]}}]
    route = one(docs, "HTTPRoute")
    assert route["apiVersion"] == "gateway.networking.k8s.io/v1"
    assert route["spec"] == {
        "parentRefs": [{"name": "public", "namespace": "infra", "sectionName": "https"}],
        "hostnames": ["llm.example.com"],
        "rules": [{"matches": [{"path": {"type": "PathPrefix", "value": "/"}}],
                   "backendRefs": [{"name": "demo-kvroute", "port": 8000}]}]}
    assert '"model": "llama-3.1-8b"' in notes(helm_bin, VALUE_SETS["huggingface"])


def test_huggingface_cache_without_a_claim_is_an_emptydir_offline_without_a_token(helm_bin):
    docs = render(helm_bin, set_values=[
        "model.source=huggingface", "model.huggingface.repoId=Qwen/Qwen2.5-0.5B-Instruct",
        "model.huggingface.offline=true"])
    args = serve_config(docs)["applications"][0]["args"]
    assert args["model"] == "Qwen/Qwen2.5-0.5B-Instruct" and "served_model_name" not in args
    pod = engine_group(docs)["template"]
    assert {"name": "hf-cache", "emptyDir": {"sizeLimit": "200Gi"}} in pod["spec"]["volumes"]
    assert [e for e in container(pod)["env"] if e["name"].startswith("HF_")] == [
        {"name": "HF_HUB_CACHE", "value": "/var/cache/huggingface"},
        {"name": "HF_HUB_OFFLINE", "value": "1"}]
    assert '"model": "Qwen/Qwen2.5-0.5B-Instruct"' in notes(
        helm_bin, set_values=["model.source=huggingface",
                              "model.huggingface.repoId=Qwen/Qwen2.5-0.5B-Instruct"])


def test_incremental_upgrade_strategy_leaves_the_ingress_to_kuberay(helm_bin):
    docs = render(helm_bin, VALUE_SETS["incremental"])
    spec = one(docs, "RayService")["spec"]
    assert spec["upgradeStrategy"] == {
        "type": "NewClusterWithIncrementalUpgrade",
        "clusterUpgradeOptions": {"gatewayClassName": "istio", "maxSurgePercent": 25,
                                  "stepSizePercent": 5, "intervalSeconds": 30}}
    # KubeRay ignores a custom serve Service here: each cluster gets its own behind its Gateway
    assert "serveService" not in spec
    assert spec["rayClusterConfig"]["enableInTreeAutoscaling"] is True
    assert "kubectl -n llm get gateway demo-kvroute-gateway" in notes(
        helm_bin, VALUE_SETS["incremental"])


@pytest.mark.parametrize("set_values, message", [
    (["upgradeStrategy.type=NewClusterWithIncrementalUpgrade",
      "upgradeStrategy.incremental.gatewayClassName=istio"],
     "NewClusterWithIncrementalUpgrade needs engine.autoscaling.enabled"),
    (["upgradeStrategy.type=NewClusterWithIncrementalUpgrade"],
     "at '/upgradeStrategy/incremental/gatewayClassName'"),
    (["upgradeStrategy.type=Rolling"], "at '/upgradeStrategy/type'"),
    (["upgradeStrategy.type=NewClusterWithIncrementalUpgrade",
      "upgradeStrategy.incremental.gatewayClassName=istio", "engine.autoscaling.enabled=true",
      "ingress.enabled=true"], "KubeRay's own Gateway and HTTPRoute are the ingress"),
    (["httpRoute.enabled=true"], "httpRoute.parentRefs must name the Gateway"),
    (["model.source=huggingface"], "at '/model/huggingface/repoId'"),
    (["model.source=huggingface", "model.huggingface.repoId=/models/llama"],
     "at '/model/huggingface/repoId'"),
    (["engine.priorityClassName=Not_A_Name"], "at '/engine/priorityClassName'"),
    (["prometheusRule.alerts.KvrouteHighTTFT.for=soon"],
     "at '/prometheusRule/alerts/KvrouteHighTTFT/for'"),
    (["prometheusRule.alerts.KvrouteReplicaDown.threshold=1"],
     "at '/prometheusRule/alerts/KvrouteReplicaDown'"),
])
def test_bad_new_values_fail_with_a_clear_message(helm_bin, set_values, message):
    result = template(helm_bin, set_values=set_values)
    assert result.returncode != 0
    assert message in result.stderr


def test_only_worker_gateways_stay_on_the_head(helm_bin):
    # Ray Serve pins the ingress request routers to every proxy pod itself: a head-only
    # resource would leave those on engine pods unschedulable.
    for value_set, name, pinned in (("gateway", "Gateway", False),
                                    ("default", "KVRouteIngressRouter", False),
                                    ("workers", "WorkerGateway", True)):
        docs = render(helm_bin, VALUE_SETS[value_set])
        gateway = serve_config(docs)["applications"][0]["deployments"][0]
        assert gateway["name"] == name
        assert ("resources" in gateway["ray_actor_options"]) is pinned, value_set
        head_params = one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"][
            "rayStartParams"]
        assert ("resources" in head_params) is pinned, value_set
