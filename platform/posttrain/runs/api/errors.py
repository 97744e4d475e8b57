"""The runs API's error helpers, at their former import path: every API answers one contract now
(posttrain.core.api.errors, applied to every view by settings.REST_FRAMEWORK), which new code imports."""

from posttrain.core.api.errors import ERRORS_RESPONSE, api_exception_handler
from posttrain.core.api.errors import field_errors as flatten_errors
from posttrain.core.api.negotiation import FileFormatNegotiation

CONFLICT_RESPONSE = ERRORS_RESPONSE


class RunsErrorsMixin:
    """What every view does by default now (settings.REST_FRAMEWORK["EXCEPTION_HANDLER"])."""

    def get_exception_handler(self):
        return api_exception_handler


__all__ = ["CONFLICT_RESPONSE", "ERRORS_RESPONSE", "FileFormatNegotiation", "RunsErrorsMixin", "flatten_errors"]
