"""A server's answers turned into results: a refusal into the APIError that names it, a download into a
file."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import httpx

from posttrain_sdk.errors import APIError, AuthError, Conflict, FieldError, NotFound, ServerUnreachable, field_errors

if TYPE_CHECKING:
    from posttrain_sdk.client.core import Client


def _error_for(response: httpx.Response) -> APIError:
    try:
        body: Any = response.json()
    except ValueError:
        body = response.text.strip()[:500] or None
    errors = field_errors(body) or [FieldError("", f"HTTP {response.status_code} {response.reason_phrase}")]
    status = response.status_code
    if status in (401, 403):
        return AuthError(status, errors, body=body)
    if status == 404:
        return NotFound(status, errors, body=body)
    if status == 409:
        return Conflict(status, errors, body=body)
    return APIError(status, errors, body=body)


def _download(client: Client, path: str, params: dict[str, Any], target: Path) -> Path:
    try:
        with client._http.stream("GET", path, params=params) as response:
            if response.status_code >= 400:
                response.read()
                raise _error_for(response)
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("wb") as f:
                for chunk in response.iter_bytes():
                    f.write(chunk)
    except httpx.TransportError as exc:
        raise ServerUnreachable(f"cannot reach {client.url}: {exc}") from None
    return target
