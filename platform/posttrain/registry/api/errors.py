"""Service errors as API responses: a field error is a 400 naming the field, an asset still in
use is a 409, user code no worker could run (none in time, or no sandbox there) a 503. Anything else
is a bug and should surface as one."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework import status
from rest_framework.exceptions import APIException
from rest_framework.exceptions import ValidationError as DRFValidationError

from posttrain.registry.services import AssetInUse, WorkerUnavailable


class Conflict(APIException):
    status_code = status.HTTP_409_CONFLICT
    default_detail = "The request conflicts with the current state of the resource."
    default_code = "conflict"


class WorkerBusy(APIException):
    status_code = status.HTTP_503_SERVICE_UNAVAILABLE
    default_detail = "No worker ran the code in time."
    default_code = "worker_unavailable"


@contextmanager
def service_errors() -> Iterator[None]:
    try:
        yield
    except DjangoValidationError as exc:
        detail = exc.message_dict if hasattr(exc, "error_dict") else {"non_field_errors": exc.messages}
        raise DRFValidationError(detail) from None
    except AssetInUse as exc:
        raise Conflict(str(exc)) from None
    except WorkerUnavailable as exc:
        raise WorkerBusy(str(exc)) from None
