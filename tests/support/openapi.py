"""An API answer checked against what the platform's OpenAPI schema (drf-spectacular, /api/schema/) documents
for it, instead of a copy of a serializer's field list in a test: every documented required field is
there, every value has its documented type, and no field is undocumented, at any depth."""

from __future__ import annotations

import functools
from typing import Any

import jsonschema


@functools.cache
def openapi_schema() -> dict[str, Any]:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def _strict(node: Any) -> Any:
    """OpenAPI 3.0 schema objects as JSON Schema: `nullable` as a null alternative, and objects that list
    their properties closed to others."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items() if key != "nullable"}
    if "properties" in out and "additionalProperties" not in out:
        out["additionalProperties"] = False
    if node.get("nullable"):
        return {"anyOf": [out, {"type": "null"}]}
    return out


@functools.cache
def _components() -> dict[str, Any]:
    return _strict(openapi_schema()["components"])


def response_schema(path: str, method: str = "get", status: int = 200) -> dict[str, Any]:
    """The documented JSON body of `method path` answering `status` (path as in the schema: `/api/runs/{id}/`)."""
    operation = openapi_schema()["paths"][path][method.lower()]
    return operation["responses"][str(status)]["content"]["application/json"]["schema"]


def assert_documented(body: Any, path: str, method: str = "get", status: int = 200) -> None:
    """`body` is what the schema documents for `method path` answering `status` (AssertionError naming the
    first difference)."""
    schema = {**_strict(response_schema(path, method, status)), "components": _components()}
    error = jsonschema.exceptions.best_match(jsonschema.Draft202012Validator(schema).iter_errors(body))
    if error is not None:
        where = "/".join(str(p) for p in error.absolute_path) or "(the body)"
        raise AssertionError(f"{method.upper()} {path} {status}: at {where}: {error.message}")
