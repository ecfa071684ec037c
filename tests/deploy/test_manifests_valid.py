"""Rendered manifests against real schemas: built-in kinds with `kubernetes-validate --strict`,
custom resources with their CRDs' openAPIV3Schema (tests/deploy/crds)."""

import copy

import kubernetes_validate
import pytest

from .crd_schema import known_kinds, validation_errors
from .helm_chart import VALUE_SETS, engine_group, head_template, render

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest bundled.
KUBERNETES_VERSIONS = ["1.26.0", "1.37.0"]
# Kinds with neither a bundled schema nor a CRD in tests/deploy/crds (the Gateway API's CRDs
# are not vendored here): tests/deploy/test_helm_chart.py checks their rendered shape exactly.
UNVALIDATED_KINDS = {("gateway.networking.k8s.io/v1", "HTTPRoute")}


def builtin_resources(docs: list[dict]) -> list[dict]:
    """Built-in kinds, including the pod templates a RayService embeds, as Pods."""
    resources = [doc for doc in docs
                 if (doc["apiVersion"], doc["kind"]) not in known_kinds() | UNVALIDATED_KINDS]
    for doc in docs:
        if doc["kind"] == "RayService":
            for name, pod in (("head", head_template(docs)),
                              ("engine", engine_group(docs)["template"])):
                resources.append({"apiVersion": "v1", "kind": "Pod",
                                  "metadata": {**pod["metadata"], "name": f"template-{name}"},
                                  "spec": pod["spec"]})
            # KubeRay makes a Service of it (adding the selector)
            if "serveService" in doc["spec"]:
                resources.append({"apiVersion": "v1", "kind": "Service",
                                  **doc["spec"]["serveService"]})
    return resources


@pytest.mark.parametrize("version", KUBERNETES_VERSIONS)
@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_builtin_kinds_pass_kubernetes_validate_strict(helm_bin, value_set, version):
    resources = builtin_resources(render(helm_bin, VALUE_SETS[value_set]))
    assert {r["kind"] for r in resources} >= {"Pod"}
    for resource in resources:
        try:
            kubernetes_validate.validate(resource, version, strict=True)
        except kubernetes_validate.ValidationError as error:
            path = ".".join(str(p) for p in error.path)
            pytest.fail(f"{resource['kind']}/{resource['metadata']['name']} {path}: "
                        f"{error.message}")


@pytest.mark.parametrize("value_set", VALUE_SETS)
def test_custom_resources_match_their_crds(helm_bin, value_set):
    docs = render(helm_bin, VALUE_SETS[value_set])
    custom = [doc for doc in docs if (doc["apiVersion"], doc["kind"]) in known_kinds()]
    assert "RayService" in {doc["kind"] for doc in custom}
    for doc in custom:
        assert validation_errors(doc) == [], doc["kind"]


def test_crd_validation_rejects_unknown_and_missing_fields(helm_bin):
    """The CRD check is strict: a misspelt field, a missing required one and a bad quantity
    are each reported."""
    service = next(doc for doc in render(helm_bin) if doc["kind"] == "RayService")
    broken = copy.deepcopy(service)
    group = broken["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]
    group["replica"] = group.pop("replicas")
    del group["minReplicas"]
    group["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = "lots"
    errors = validation_errors(broken)
    assert len(errors) == 3
    assert errors[0].startswith("spec.rayClusterConfig.workerGroupSpecs.0.template.spec."
                                "containers.0.resources.limits.cpu: 'lots' does not match")
    assert errors[1] == ("spec.rayClusterConfig.workerGroupSpecs.0: "
                         "'minReplicas' is a required property")
    assert errors[2] == ("spec.rayClusterConfig.workerGroupSpecs.0: Additional properties "
                         "are not allowed ('replica' was unexpected)")


def test_kubernetes_validate_strict_rejects_unknown_fields(helm_bin):
    service = next(doc for doc in render(helm_bin, VALUE_SETS["workers"])
                   if doc["kind"] == "Service")
    service["spec"]["selecter"] = service["spec"].pop("selector")
    with pytest.raises(kubernetes_validate.ValidationError, match="'selecter' was unexpected"):
        kubernetes_validate.validate(service, KUBERNETES_VERSIONS[-1], strict=True)
