"""helm/kvroute rendered by the real helm binary: lint, every value set, bad values."""

import json
import re

import pytest
import yaml

from .helm_chart import (
    CHART,
    REPO,
    VALUE_SETS,
    engine_group,
    head_template,
    lint,
    notes,
    one,
    render,
    serve_config,
    template,
)

# The OpenAI endpoint's Service is the RayService's own (KubeRay creates it), except in front
# of external workers.
EXPECTED_KINDS = {
    "default": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule", "RayService"],
    "pvc-tp4": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule", "RayService"],
    "autoscaling": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule",
                    "RayService"],
    "sim-minimal": ["RayService"],
    "gateway": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule", "RayService"],
    "workers": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule", "RayService",
                "Service"],
    "huggingface": ["ConfigMap", "HTTPRoute", "Ingress", "NetworkPolicy", "PodMonitor",
                    "PrometheusRule", "RayService"],
    "incremental": ["ConfigMap", "NetworkPolicy", "PodMonitor", "PrometheusRule",
                    "RayService"],
}


def container(pod_template: dict) -> dict:
    (only,) = pod_template["spec"]["containers"]
    return only


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_lint_passes(helm_bin, value_set):
    result = lint(helm_bin, VALUE_SETS[value_set])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in result.stdout


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_template_renders_the_enabled_components(helm_bin, value_set):
    docs = render(helm_bin, VALUE_SETS[value_set])
    assert sorted(doc["kind"] for doc in docs) == EXPECTED_KINDS[value_set]


def test_default_values(helm_bin):
    docs = render(helm_bin)
    assert one(docs, "RayService")["metadata"]["name"] == "demo-kvroute"
    assert serve_config(docs) == {
        "proxy_location": "EveryNode",
        "http_options": {"host": "0.0.0.0", "port": 8000},
        "applications": [{
            "name": "kvroute",
            "route_prefix": "/",
            "import_path": "router.apps.build:build_app",
            "args": {
                "model": "tiny", "engine": "real", "replicas": 2, "tp": 1, "block_size": 16,
                "num_blocks": 1024, "num_host_blocks": 0, "cpus_per_rank": 1,
                "gpus_per_rank": 1, "policy": "cache_aware", "approximate": False,
                "load_weight": 0.2, "host_cost_fraction": 0.2, "gateways": 2,
                "ingress": "direct", "pooled_sample_rate": 0.01, "pooled_window_s": 600,
            },
            # no head-only resource: Serve pins the routers to every proxy pod itself
            "deployments": [{"name": "KVRouteIngressRouter",
                             "ray_actor_options": {"num_cpus": 0}}],
        }],
    }
    group = engine_group(docs)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 2, 2)
    worker = container(group["template"])
    assert worker["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert worker["resources"]["requests"]["nvidia.com/gpu"] == 1
    head = one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"] == {"dashboard-host": "0.0.0.0", "num-gpus": "0"}
    spec = one(docs, "RayService")["spec"]
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    assert spec["excludeHeadPodFromServeSvc"] is False
    assert spec["serveService"]["metadata"]["name"] == "demo-kvroute"
    assert spec["serveService"]["spec"] == {"type": "ClusterIP",
                                            "ports": [{"name": "serve", "port": 8000}]}
    assert "nvidia.com/gpu" not in container(head["template"])["resources"]["limits"]
    assert "enableInTreeAutoscaling" not in one(docs, "RayService")["spec"]["rayClusterConfig"]
    assert "volumes" not in head["template"]["spec"]


def test_pvc_model_tp4_api_keys_and_host_tier(helm_bin):
    docs = render(helm_bin, VALUE_SETS["pvc-tp4"])
    args = serve_config(docs)["applications"][0]["args"]
    assert args == {
        "model": "/models/llama-3-70b-instruct", "engine": "real", "replicas": 3, "tp": 4,
        "block_size": 32, "num_blocks": 65536, "num_host_blocks": 131072, "cpus_per_rank": 4,
        "gpus_per_rank": 1, "policy": "cache_aware", "approximate": False,
        "load_weight": 0.25, "host_cost_fraction": 0.1, "gateways": 2,
        "ingress": "direct", "pooled_sample_rate": 0.02, "pooled_window_s": 1800,
        "api_keys_file": "/etc/kvroute/api-keys/keys.txt",
    }
    group = engine_group(docs)
    assert group["replicas"] == 3
    worker = container(group["template"])
    assert worker["resources"] == {
        "requests": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 4},
        "limits": {"cpu": "32", "memory": "256Gi", "nvidia.com/gpu": 4},
    }
    volumes = [
        {"name": "model", "persistentVolumeClaim": {"claimName": "llama-weights",
                                                    "readOnly": True}},
        {"name": "api-keys", "secret": {"secretName": "llm-api-keys"}},
    ]
    mounts = [{"name": "model", "mountPath": "/models", "readOnly": True},
              {"name": "api-keys", "mountPath": "/etc/kvroute/api-keys", "readOnly": True}]
    head = head_template(docs)
    assert head["spec"]["volumes"] == volumes
    assert container(head)["volumeMounts"] == mounts
    assert group["template"]["spec"]["volumes"][1:] == volumes
    assert container(group["template"])["volumeMounts"][1:] == mounts
    for pod in (head, group["template"]):
        assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "32Gi"}} in (
        group["template"]["spec"]["volumes"])
    assert group["template"]["spec"]["nodeSelector"] == {
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}
    assert [t["key"] for t in group["template"]["spec"]["tolerations"]] == [
        "nvidia.com/gpu", "dedicated"]
    assert head["spec"]["nodeSelector"] == {"node-role.kubernetes.io/cpu": "true"}
    service = one(docs, "RayService")["spec"]["serveService"]
    assert service["spec"]["type"] == "LoadBalancer"
    assert service["metadata"]["annotations"] == {
        "service.beta.kubernetes.io/aws-load-balancer-scheme": "internal"}
    assert one(docs, "PodMonitor")["metadata"]["labels"]["release"] == "kube-prometheus-stack"
    assert one(docs, "PrometheusRule")["metadata"]["labels"]["release"] == (
        "kube-prometheus-stack")
    assert one(docs, "ConfigMap")["metadata"]["annotations"] == {"grafana_folder": "LLM"}


def test_image_model_with_autoscaling(helm_bin):
    docs = render(helm_bin, VALUE_SETS["autoscaling"])
    cluster = one(docs, "RayService")["spec"]["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"] == {"upscalingMode": "Default", "idleTimeoutSeconds": 120}
    group = engine_group(docs)
    assert (group["replicas"], group["minReplicas"], group["maxReplicas"]) == (2, 1, 6)
    assert container(group["template"])["resources"]["limits"]["nvidia.com/gpu"] == 2
    app = serve_config(docs)["applications"][0]
    assert (app["args"]["model"], app["args"]["policy"], app["args"]["approximate"]) == (
        "/opt/models/llama-3-8b", "least_load", True)
    assert app["deployments"][1] == {
        "name": "EngineReplica", "num_replicas": "auto",
        "autoscaling_config": {"initial_replicas": 2, "min_replicas": 1, "max_replicas": 6,
                               "target_ongoing_requests": 8}}
    assert "volumes" not in head_template(docs)["spec"]


def test_sim_engines_request_no_gpus(helm_bin):
    docs = render(helm_bin, VALUE_SETS["sim-minimal"])
    assert one(docs, "RayService")["metadata"]["name"] == "kvroute-sim"
    args = serve_config(docs)["applications"][0]["args"]
    assert (args["engine"], args["replicas"], args["policy"], args["gpus_per_rank"]) == (
        "sim", 4, "round_robin", 0)
    group = engine_group(docs)
    assert container(group["template"])["resources"] == {
        "requests": {"cpu": "2", "memory": "4Gi"}, "limits": {"cpu": "2", "memory": "4Gi"}}
    assert "tolerations" not in group["template"]["spec"]


@pytest.mark.parametrize("set_values, message", [
    (["engine.replicas=-1"], "at '/engine/replicas': minimum: got -1, want 1"),
    (["engine.tp=0"], "at '/engine/tp': minimum: got 0, want 1"),
    (["routing.policy=greedy"],
     "at '/routing/policy': value must be one of 'cache_aware', 'round_robin', 'least_load', "
     "'random', 'consistent_hash', 'longest_prefix'"),
    (["engine.replica=3"], "at '/engine': additional properties 'replica' not allowed"),
    (["model.source=pvc"], "at '/model/pvc/claimName'"),
    (["engine.autoscaling.enabled=true", "engine.autoscaling.minReplicas=5"],
     "engine.autoscaling.minReplicas (5) must not exceed engine.autoscaling.maxReplicas (4)"),
    (["engine.autoscaling.enabled=true", "engine.replicas=9"],
     "engine.replicas (9) must lie within engine.autoscaling bounds [1, 4]"),
    (["engine.resources.limits.nvidia\\.com/gpu=2"],
     "engine.resources.limits must not set nvidia.com/gpu"),
])
def test_bad_values_fail_with_a_clear_message(helm_bin, set_values, message):
    result = template(helm_bin, set_values=set_values)
    assert result.returncode != 0
    assert message in result.stderr
    assert result.stdout == ""


def test_pod_monitor_scrapes_every_pod_for_its_own_series(helm_bin):
    docs = render(helm_bin)
    head, worker = head_template(docs), engine_group(docs)["template"]
    monitor = one(docs, "PodMonitor")["spec"]
    for pod in (head, worker):
        assert monitor["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()
        # the Serve proxy every node runs (EveryNode) answers /metrics on the serve port
        assert [p for p in container(pod)["ports"] if p["name"] == "serve"] == [
            {"name": "serve", "containerPort": 8000}]
    assert serve_config(docs)["http_options"]["port"] == 8000
    assert serve_config(docs)["proxy_location"] == "EveryNode"
    # /metrics?node=<pod IP>: that pod's processes (docs/metrics.md); job kvroute, node label
    assert monitor["podMetricsEndpoints"] == [{
        "port": "serve", "path": "/metrics", "interval": "15s",
        "relabelings": [
            {"sourceLabels": ["__meta_kubernetes_pod_ip"], "targetLabel": "__param_node"},
            {"sourceLabels": ["__meta_kubernetes_pod_node_name"], "targetLabel": "node"},
            {"targetLabel": "job", "replacement": "kvroute"}]}]


def test_workers_keep_a_service_on_the_head_where_the_worker_gateways_listen(helm_bin):
    docs = render(helm_bin, VALUE_SETS["workers"])
    head, service = head_template(docs), one(docs, "Service")
    assert service["spec"]["selector"].items() <= head["metadata"]["labels"].items()
    assert service["spec"]["selector"]["app.kubernetes.io/component"] == "gateway"
    assert service["spec"]["ports"] == [{"name": "serve", "port": 8000, "targetPort": "serve",
                                         "protocol": "TCP"}]
    spec = one(docs, "RayService")["spec"]
    assert "serveService" not in spec and "excludeHeadPodFromServeSvc" not in spec
    assert head_template(docs)["spec"]["containers"][0]["name"] == "ray-head"
    assert one(docs, "RayService")["spec"]["rayClusterConfig"]["headGroupSpec"][
        "rayStartParams"]["resources"] == '"{\\"kvroute_gateway\\": 1000}"'
    (app,) = serve_config(docs)["applications"]
    assert app["deployments"][0]["ray_actor_options"]["resources"] == {"kvroute_gateway": 1}


def test_dashboard_configmap_carries_the_dashboard_verbatim(helm_bin):
    config_map = one(render(helm_bin), "ConfigMap")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    with open(REPO / "dashboards" / "kvroute.json") as f:
        assert json.loads(config_map["data"]["kvroute.json"]) == json.load(f)


def test_prometheus_rule_carries_the_rule_file_verbatim_at_the_defaults(helm_bin):
    rule = one(render(helm_bin), "PrometheusRule")
    with open(REPO / "dashboards" / "rules" / "kvroute.rules.yaml") as f:
        assert rule["spec"] == yaml.safe_load(f)


def test_notes_show_a_first_request(helm_bin):
    text = notes(helm_bin)
    assert "kubectl -n llm port-forward svc/demo-kvroute 8000:8000" in text
    assert "kubectl -n llm port-forward svc/kvroute-sim-serve-svc 8000:8000" in notes(
        helm_bin, VALUE_SETS["sim-minimal"])
    assert "curl http://127.0.0.1:8000/v1/completions" in text
    assert '"model": "tiny"' in text
    assert "Authorization" not in text
    with_keys = notes(helm_bin, VALUE_SETS["pvc-tp4"])
    assert '"model": "llama-3-70b-instruct"' in with_keys
    assert "get secret llm-api-keys -o jsonpath='{.data.keys\\.txt}' | base64 -d" in with_keys
    assert '-H "Authorization: Bearer $KVROUTE_API_KEY"' in with_keys
    assert "simulated" in notes(helm_bin, VALUE_SETS["sim-minimal"])
    without_service = notes(helm_bin, VALUE_SETS["workers"], ["service.enabled=false"])
    assert "app.kubernetes.io/component=gateway" in without_service


def test_every_value_is_documented():
    """helm-docs convention: a `# --` comment right above each key; it documents the key's
    whole value (so `resources` documents its `requests`). Keys without one must be
    sections whose keys are all documented."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    key = re.compile(r"^(\s*)([A-Za-z][\w.-]*):\s*(.*)$")
    undocumented = []
    documented_indents: list[int] = []  # indents of documented ancestors of the current line
    for number, line in enumerate(lines):
        match = key.match(line)
        if not match:
            continue
        indent, name, value = len(match.group(1)), match.group(2), match.group(3)
        documented_indents = [i for i in documented_indents if i < indent]
        if documented_indents:
            continue  # part of a documented value
        above = number - 1
        while above >= 0 and re.match(r"^\s*#(?! --)", lines[above]):
            above -= 1  # continuation lines of a multi-line comment
        if above >= 0 and lines[above].lstrip().startswith("# -- "):
            documented_indents.append(indent)
        elif value != "":
            undocumented.append(name)  # a value without a comment (a section has no value)
    assert undocumented == []

