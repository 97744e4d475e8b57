"""Errors of the SDK. Every refusal of the server becomes an APIError whose `errors` name the field,
whatever shape the endpoint answered in (`{"errors": [{"loc", "msg"}]}`, `{"field": ["msg"]}` or
`{"detail": "msg"}`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class FieldError:
    loc: str  # "" when the error is about the request as a whole
    msg: str

    def __str__(self) -> str:
        return f"{self.loc}: {self.msg}" if self.loc else self.msg


class PosttrainError(Exception):
    """Anything the SDK refuses or cannot do; the message is one line meant for a person."""


class NotLoggedIn(PosttrainError):
    pass


class ServerUnreachable(PosttrainError):
    pass


class APIError(PosttrainError):
    def __init__(self, status: int, errors: list[FieldError], *, body: Any = None):
        self.status = status
        self.errors = errors
        self.body = body
        super().__init__("; ".join(str(e) for e in errors) or f"HTTP {status}")

    @property
    def fields(self) -> dict[str, str]:
        """{loc: msg} of the field errors (the first message per field)."""
        out: dict[str, str] = {}
        for error in self.errors:
            out.setdefault(error.loc, error.msg)
        return out


class AuthError(APIError):
    """401/403: no token, a token the server no longer knows, or a role that may not do this."""


class NotFound(APIError):
    pass


class Conflict(APIError):
    """409: the object is not in a state that allows this (a finished run cancelled, an asset in use)."""


def field_errors(body: Any, prefix: str = "") -> list[FieldError]:
    """The server's error body as FieldErrors, `rewards[0].weight`-style locations."""
    if isinstance(body, dict):
        return _dict_field_errors(body, prefix)
    if isinstance(body, list):
        return _list_field_errors(body, prefix)
    if body in (None, ""):
        return []
    return [FieldError(prefix, str(body))]


def _dict_field_errors(body: dict, prefix: str) -> list[FieldError]:
    """An object: `{"errors": [{"loc", "msg"}]}`, or `{"field": ...}` with the field named in the location."""
    if isinstance(body.get("errors"), list):
        return [FieldError(str(e.get("loc", "")), str(e.get("msg", e))) for e in body["errors"] if isinstance(e, dict)]
    out: list[FieldError] = []
    for key, value in body.items():
        if key in ("detail", "non_field_errors"):
            out += field_errors(value, prefix)
        elif key in ("state", "expected_seq"):
            continue  # context of a conflict, not an error of its own
        else:
            out += field_errors(value, f"{prefix}.{key}" if prefix else str(key))
    return out


def _list_field_errors(body: list, prefix: str) -> list[FieldError]:
    """A list: messages at `prefix`, objects and lists within at `prefix[i]`."""
    out: list[FieldError] = []
    for i, item in enumerate(body):
        if isinstance(item, (dict, list)):
            out += field_errors(item, f"{prefix}[{i}]")
        elif item not in (None, ""):
            out.append(FieldError(prefix, str(item)))
    return out
