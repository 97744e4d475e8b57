"""Query parameters of the API views: a bad value is a 400 naming the parameter."""

from __future__ import annotations

from rest_framework.request import Request

from posttrain.core.errors import InvalidInput


def int_param(request: Request, name: str, *, low: int | None = None, high: int | None = None) -> int | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = int(raw)
    except ValueError:
        raise InvalidInput.one(name, f"must be an integer, got {raw[:50]!r}") from None
    if (low is not None and value < low) or (high is not None and value > high):
        raise InvalidInput.one(name, f"must be between {low} and {high}, got {raw[:50]}")
    return value


def text_param(request: Request, name: str) -> str | None:
    """A free-text query parameter; NUL characters (which Postgres refuses) are dropped."""
    return request.query_params.get(name, "").replace("\x00", "").strip() or None


def float_param(request: Request, name: str) -> float | None:
    raw = request.query_params.get(name)
    if raw in (None, ""):
        return None
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if value != value or value in (float("inf"), float("-inf")):
        raise InvalidInput.one(name, f"must be a finite number, got {raw[:50]!r}")
    return value
