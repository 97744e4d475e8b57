"""The platform's errors: what a service refuses, raised as one of these and answered by every API in
one shape (docs/ARCHITECTURE.md, "The error contract"):

    {"errors": [{"loc": "rollout.samples_per_prompt", "msg": "must be at least 2"}]}

`loc` names the input at fault (a dotted/bracketed path like `rewards[0].weight`, a query parameter, a
header), "" when the error is about the request as a whole. A conflict adds what the client needs to
recover: `state` (the object's state now) or `expected_seq` (the event seq ingestion wants next).

    InvalidInput        400  bad input, every error naming its field
    IngestAuthError     401  no bearer token / 403 a token not valid for this run
    PermissionDenied    403
    NotFound            404
      NotAssigned       404  a campaign not in the annotator's queue: the same answer as a wrong id
    MethodNotAllowed    405
    Conflict            409
      IllegalTransition 409  + state: the object's state does not allow this
      SeqConflict       409  + expected_seq: a batch that does not continue the stored events
      ItemUnavailable   409  a review item someone else holds, or one judged already
      AssetInUse        409  deleting a model, dataset or reward an experiment uses
    PayloadTooLarge     413
    Unavailable         503  a service the request needs cannot be reached
      DispatchError     503  Ray's Jobs API (job logs)
      WorkerUnavailable 503  user code no Celery worker ran in time, or a worker with no sandbox for it
      DatabaseUnavailable 503  Postgres down or restarting (+ Retry-After): the client retries

Django's and DRF's own errors (ValidationError, 404, 403, 405, parse errors, throttling) are answered
in the same shape by posttrain.core.api.errors. JobsUnavailable is no answer: the Celery task retries on it.
"""

from __future__ import annotations

from typing import Any

FieldError = dict[str, str]  # {"loc": ..., "msg": ...}


class ServiceError(Exception):
    """A refusal the API answers with `status_code` and `payload()`; never a 500."""

    status_code = 400

    def __init__(self, message: str, *, loc: str = ""):
        self.errors: list[FieldError] = [{"loc": loc, "msg": message}]
        super().__init__(message)

    def context(self) -> dict[str, Any]:
        """Fields next to `errors` that tell the client how to recover."""
        return {}

    def payload(self) -> dict[str, Any]:
        return {"errors": self.errors, **self.context()}


class InvalidInput(ServiceError):
    """Bad input; each error names its field (`loc`, dotted/bracketed path) and says what is wrong."""

    status_code = 400

    def __init__(self, errors: list[dict[str, str]]):
        fields = [{"loc": str(e.get("loc", "")), "msg": str(e["msg"])} for e in errors]
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in fields))
        self.errors = fields

    @classmethod
    def one(cls, loc: str, msg: str) -> InvalidInput:
        return cls([{"loc": loc, "msg": msg}])


class IngestAuthError(ServiceError):
    """The engine's post without the run's own bearer token (401) or with another's (403)."""

    def __init__(self, message: str, status_code: int = 403):
        self.status_code = status_code
        super().__init__(message)


class NotAuthenticated(ServiceError):
    """Credentials that name nobody (an unknown API token)."""

    status_code = 401


class PermissionDenied(ServiceError):
    status_code = 403


class NotFound(ServiceError):
    status_code = 404


class NotAssigned(NotFound):
    """Annotators learn nothing about campaigns they are not assigned to: the same answer as a wrong id."""

    def __init__(self) -> None:
        super().__init__("Not found.")


class MethodNotAllowed(ServiceError):
    status_code = 405

    def __init__(self, method: str):
        super().__init__(f'Method "{method}" not allowed.')


class Conflict(ServiceError):
    status_code = 409


class IllegalTransition(Conflict):
    def __init__(self, message: str, state: str):
        self.state = state
        super().__init__(message)

    def context(self) -> dict[str, Any]:
        return {"state": self.state}


class SeqConflict(Conflict):
    """A batch that does not continue the stored events; the engine re-sends from `expected_seq`."""

    def __init__(self, expected_seq: int, message: str):
        self.expected_seq = expected_seq
        super().__init__(message)

    def context(self) -> dict[str, Any]:
        return {"expected_seq": self.expected_seq}


class ItemUnavailable(Conflict):
    """Another annotator holds the item, it has all its judgements, or you judged it already."""


class AssetInUse(Conflict):
    """Deleting a model, dataset or reward that an experiment still uses."""


class PayloadTooLarge(ServiceError):
    status_code = 413


class Unavailable(ServiceError):
    status_code = 503


class DispatchError(Unavailable):
    """Ray could not be reached (the web process reads job logs over the Jobs HTTP API)."""


class WorkerUnavailable(Unavailable):
    """User code the request needs run (a reward's "Try it", a new reward's import check) did not run: no
    worker took it in time, or the worker cannot sandbox it (the message says what to install)."""


class DatabaseUnavailable(Unavailable):
    """The database refused or dropped the connection (Postgres stopped, restarting, out of connections):
    the client sends the request again once it is back (event ingestion is idempotent by seq)."""

    retry_after_s = 5

    def __init__(self) -> None:
        super().__init__(f"the database cannot be reached just now; retry in {self.retry_after_s} s")


class JobsUnavailable(Exception):
    """Ray's Jobs API could not take the request just now (unreachable, its job agent still starting,
    a 5xx): the submit is retried, and the run stays `queued` meanwhile. Not an API answer."""
