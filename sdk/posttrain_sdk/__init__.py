"""Posttrain's Python SDK: the REST API typed (`Client`) and tracking of runs of other engines
(`init` / `log` / `log_samples` / `finish`). Documented in the repository's README, "Use from Python
and the terminal" and "Track a TRL / OpenRLHF / verl run".

    import posttrain_sdk as posttrain
"""

from posttrain_sdk.client import Client
from posttrain_sdk.errors import APIError, AuthError, Conflict, FieldError, NotFound, NotLoggedIn, PosttrainError
from posttrain_sdk.tracking import TrackedRun, finish, init, log, log_samples, sync

__all__ = [
    "APIError",
    "AuthError",
    "Client",
    "Conflict",
    "FieldError",
    "NotFound",
    "NotLoggedIn",
    "PosttrainError",
    "TrackedRun",
    "finish",
    "init",
    "log",
    "log_samples",
    "sync",
]
__version__ = "0.1.0"
