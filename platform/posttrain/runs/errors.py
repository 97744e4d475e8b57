"""The runs services' errors, at their former import path: they are the platform's one family now,
posttrain.core.errors, which new code imports."""

from posttrain.core.errors import (
    DispatchError,
    IllegalTransition,
    IngestAuthError,
    InvalidInput,
    JobsUnavailable,
    SeqConflict,
)
from posttrain.core.errors import ServiceError as RunsError

__all__ = [
    "DispatchError",
    "IllegalTransition",
    "IngestAuthError",
    "InvalidInput",
    "JobsUnavailable",
    "RunsError",
    "SeqConflict",
]
