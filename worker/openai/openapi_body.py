"""Request bodies in the OpenAPI document, from the same pydantic models `parse_body` uses.

The routes read their bodies themselves (limits first, then `parse_body`, for OpenAI-shaped
errors), so FastAPI cannot infer the body; `openapi_extra=request_body(Model)` declares it,
and a fuzzer (schemathesis) has something to vary. The schema is inlined (no `$defs`), so
it is valid wherever the document puts it.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel


def request_body(model_cls: type[BaseModel]) -> dict[str, Any]:
    schema = model_cls.model_json_schema()
    defs = schema.pop("$defs", {})
    return {"requestBody": {"required": True, "content": {
        "application/json": {"schema": _inline(schema, defs)}}}}


def _inline(node: Any, defs: dict[str, Any]) -> Any:
    if isinstance(node, dict):
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith("#/$defs/"):
            return _inline(defs[ref.removeprefix("#/$defs/")], defs)
        return {k: _inline(v, defs) for k, v in node.items()}
    if isinstance(node, list):
        return [_inline(v, defs) for v in node]
    return node
