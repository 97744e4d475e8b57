"""A database outage answered as one, on every page and stream: 503 with Retry-After, in the error
contract's shape under /api/ and as a line of text elsewhere. DRF views answer it in their own handler
(posttrain.core.api.errors); this covers the rest: server-rendered pages, the run stream, the admin."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

from asgiref.sync import iscoroutinefunction, markcoroutinefunction
from django.db import InterfaceError, OperationalError
from django.http import HttpRequest, HttpResponse

from posttrain.core.errors import DatabaseUnavailable

Handler = Callable[[HttpRequest], HttpResponse] | Callable[[HttpRequest], Awaitable[HttpResponse]]


def database_unavailable_response(request: HttpRequest) -> HttpResponse:
    from posttrain.core.api.errors import error_response

    unavailable = DatabaseUnavailable()
    if request.path.startswith("/api/"):
        response: HttpResponse = error_response(unavailable)
    else:
        response = HttpResponse(str(unavailable), status=unavailable.status_code, content_type="text/plain")
    response["Retry-After"] = str(unavailable.retry_after_s)
    return response


class DatabaseUnavailableMiddleware:
    """Both sync and async (the run stream is an async view: no thread hop on its way)."""

    sync_capable = True
    async_capable = True

    def __init__(self, get_response: Handler):
        self.get_response = get_response
        if iscoroutinefunction(get_response):
            markcoroutinefunction(self)

    def __call__(self, request: HttpRequest):
        return self.get_response(request)

    def process_exception(self, request: HttpRequest, exception: Exception) -> HttpResponse | None:
        if isinstance(exception, (OperationalError, InterfaceError)):
            return database_unavailable_response(request)
        return None
