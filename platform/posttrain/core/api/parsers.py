"""Request body parsers shared by every API view."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import parsers
from rest_framework.exceptions import ParseError


class JSONParser(parsers.JSONParser):
    """DRF's JSON parser, with a body nested past the interpreter's recursion limit (`[` x 100,000) as a
    400 naming the problem instead of a RecursionError (a 500)."""

    def parse(self, stream: Any, media_type: str | None = None, parser_context: Mapping[str, Any] | None = None) -> Any:
        try:
            return super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError("JSON parse error - the body is nested too deeply") from None
