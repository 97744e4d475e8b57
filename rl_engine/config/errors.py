"""The config's error type: field-level `{"loc", "msg"}` errors, ready for a form or a 400 response."""

from __future__ import annotations


class ConfigError(Exception):
    """An invalid run config; `errors` lists `{"loc": "a.b.c", "msg": str}` ("" = whole config)."""

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = [{"loc": str(e.get("loc", "")), "msg": str(e["msg"])} for e in errors]
        super().__init__(str(self))

    def __str__(self) -> str:
        return "\n".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in self.errors)


class FieldErrors(ValueError):
    """Raised by cross-field validators: errors keyed by a field path relative to the model that
    runs the validator. Pydantic keeps the exception object in the error's ctx, which is how
    `error_messages.config_error_from` gets the exact field paths back (a plain ValueError from a model
    validator would be reported against the whole model)."""

    def __init__(self, errors: list[tuple[str, str]]):
        self.errors = errors
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in errors))
