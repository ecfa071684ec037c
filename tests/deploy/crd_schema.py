"""Validates custom resources against the openAPIV3Schema of their CRDs (tests/deploy/crds).

The API server prunes fields a structural schema does not declare and, with strict field
validation (kubectl's default since 1.27), rejects them. JSON Schema allows them unless told
otherwise, so every object schema that lists `properties` is closed here, except where the CRD
keeps unknown fields on purpose (`x-kubernetes-preserve-unknown-fields`).
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import jsonschema
import yaml

CRD_DIR = Path(__file__).with_name("crds")


def strict_schema(schema: dict) -> dict:
    """A copy of an OpenAPI v3 (Kubernetes structural) schema as strict JSON Schema."""
    out = {key: value for key, value in schema.items()}
    if out.pop("nullable", False) and "type" in out:
        out["type"] = [out["type"], "null"]
    if "properties" in out:
        out["properties"] = {name: strict_schema(sub) for name, sub in out["properties"].items()}
        if ("additionalProperties" not in out
                and not out.get("x-kubernetes-preserve-unknown-fields", False)):
            out["additionalProperties"] = False
    if isinstance(out.get("additionalProperties"), dict):
        out["additionalProperties"] = strict_schema(out["additionalProperties"])
    if "items" in out:
        out["items"] = strict_schema(out["items"])
    for key in ("allOf", "anyOf", "oneOf"):
        if key in out:
            out[key] = [strict_schema(sub) for sub in out[key]]
    return out


@cache
def _validators() -> dict[tuple[str, str], jsonschema.protocols.Validator]:
    """(apiVersion, kind) -> validator, for every served version of every CRD in CRD_DIR."""
    validators = {}
    for path in sorted(CRD_DIR.glob("*.yaml")):
        with open(path) as f:
            crd = yaml.load(f, Loader=yaml.CSafeLoader)
        group, kind = crd["spec"]["group"], crd["spec"]["names"]["kind"]
        for version in crd["spec"]["versions"]:
            if version.get("served", False):
                schema = strict_schema(version["schema"]["openAPIV3Schema"])
                # OpenAPI 3.0 is JSON Schema draft 4 plus extensions (boolean exclusiveMinimum).
                validators[(f"{group}/{version['name']}", kind)] = jsonschema.Draft4Validator(
                    schema)
    return validators


def known_kinds() -> set[tuple[str, str]]:
    return set(_validators())


def validation_errors(resource: dict) -> list[str]:
    """Every schema violation of `resource` as 'path: message'; empty when it is valid.

    Raises KeyError when no CRD in CRD_DIR defines the resource's apiVersion and kind.
    """
    key = (resource["apiVersion"], resource["kind"])
    if key not in _validators():
        raise KeyError(f"no CRD for {key[1]} {key[0]} in {CRD_DIR}")
    errors = _validators()[key].iter_errors(resource)
    return sorted(f"{'.'.join(str(p) for p in error.absolute_path) or '<root>'}: {error.message}"
                  for error in errors)
