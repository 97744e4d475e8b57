"""Errors raised by the runs services. The API maps each to a 4xx response (never a 500):

InvalidInput      400  {"errors": [{"loc": "rollout.samples_per_prompt", "msg": "..."}]}
IngestAuthError   401/403
IllegalTransition 409  {"detail": "...", "state": "<current state>"}
SeqConflict       409  {"detail": "...", "expected_seq": N}
"""

from __future__ import annotations


class RunsError(Exception):
    status_code = 400

    def payload(self) -> dict:
        return {"detail": str(self)}


class InvalidInput(RunsError):
    """Bad input; each error names its field (`loc`, dotted/bracketed path) and says what is wrong."""

    status_code = 400

    def __init__(self, errors: list[dict[str, str]]):
        self.errors = [{"loc": str(e.get("loc", "")), "msg": str(e["msg"])} for e in errors]
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"] for e in self.errors))

    @classmethod
    def one(cls, loc: str, msg: str) -> InvalidInput:
        return cls([{"loc": loc, "msg": msg}])

    def payload(self) -> dict:
        return {"errors": self.errors}


class IllegalTransition(RunsError):
    status_code = 409

    def __init__(self, message: str, state: str):
        self.state = state
        super().__init__(message)

    def payload(self) -> dict:
        return {"detail": str(self), "state": self.state}


class SeqConflict(RunsError):
    """A batch that does not continue the stored events; the engine re-sends from `expected_seq`."""

    status_code = 409

    def __init__(self, expected_seq: int, message: str):
        self.expected_seq = expected_seq
        super().__init__(message)

    def payload(self) -> dict:
        return {"detail": str(self), "expected_seq": self.expected_seq}


class IngestAuthError(RunsError):
    def __init__(self, message: str, status_code: int = 403):
        self.status_code = status_code
        super().__init__(message)


class DispatchError(RunsError):
    """Ray could not be reached (the web process reads job logs over the Jobs HTTP API)."""

    status_code = 503


class JobsUnavailable(Exception):
    """Ray's Jobs API could not take the request just now (unreachable, its job agent still starting,
    a 5xx): the submit is retried, and the run stays `queued` meanwhile."""
