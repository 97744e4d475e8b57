"""Content negotiation for file downloads."""

from __future__ import annotations

from rest_framework.negotiation import BaseContentNegotiation
from rest_framework.renderers import JSONRenderer


class FileFormatNegotiation(BaseContentNegotiation):
    """For file downloads whose `?format=` names the file type, not a DRF renderer; errors answer in JSON."""

    def select_parser(self, request, parsers):
        return parsers[0] if parsers else None

    def select_renderer(self, request, renderers, format_suffix=None):
        return JSONRenderer(), JSONRenderer.media_type
