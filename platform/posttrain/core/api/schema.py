"""The OpenAPI schema's view of the error contract: every operation lists the errors any endpoint of its
kind can answer (400 with input, 403 behind a permission, 404 under an id), each with the one `Errors`
body (posttrain.core.api.errors), so views declare only the codes particular to them (409, 413, 503)."""

from __future__ import annotations

from typing import Any

from drf_spectacular import openapi
from rest_framework.permissions import AllowAny

from posttrain.core.api.errors import ERRORS_RESPONSE

BODY_METHODS = ("POST", "PUT", "PATCH")
ERROR_DESCRIPTIONS = {
    "400": "Invalid input: each error names its field (`loc`) and says what is wrong.",
    "401": "No credentials, or ones that are not valid here.",
    "403": "Not signed in, or your role may not use this endpoint.",
    "404": "No such object (or none you may see).",
    "409": "The object's state does not allow this now (`state`: the state it is in).",
    "413": "The request body is larger than this endpoint takes.",
    "503": "A service this request needs cannot be reached.",
}


class AutoSchema(openapi.AutoSchema):
    def get_operation(self, path, path_regex, path_prefix, method, registry) -> dict[str, Any] | None:
        operation = super().get_operation(path, path_regex, path_prefix, method, registry)
        if operation is None:
            return None
        responses = operation["responses"]
        for code in self._common_errors(operation):
            responses.setdefault(code, self._get_response_for_code(ERRORS_RESPONSE, code))
        for code, response in responses.items():
            if code in ERROR_DESCRIPTIONS and not response.get("description"):
                response["description"] = ERROR_DESCRIPTIONS[code]
        return operation

    def _common_errors(self, operation: dict[str, Any]) -> list[str]:
        codes = []
        queried = any(parameter["in"] == "query" for parameter in operation.get("parameters", []))
        if self.method in BODY_METHODS or queried:
            codes.append("400")
        if not all(isinstance(permission, AllowAny) for permission in self.view.get_permissions()):
            codes.append("403")
        if "{" in self.path:
            codes.append("404")
        return codes


__all__ = ["AutoSchema", "ERROR_DESCRIPTIONS"]
