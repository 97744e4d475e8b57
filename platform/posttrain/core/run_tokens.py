"""Per-run ingestion tokens (docs/ARCHITECTURE.md, "Events"): the engine of run R may post events for R only.

The token is derived, not stored: HMAC-SHA256(SECRET_KEY, "posttrain-ingest:<run id>"). The database
keeps only its sha256 (`Run.ingest_token_hash`) and the token never travels through the broker: the
worker re-derives it when it submits the job and writes it to a 0600 file of its own in the run folder
(`ingest_token.<nonce>`), which the engine reads once and deletes (workers/ray_jobs.py; never in the job's
runtime_env, which anyone who can list Ray jobs can read). A submit whose job already existed removes the
file it wrote, and whatever is left when the job ends is removed too (`token_files_remove`): no path leaves
a token on disk. Consequence: the web processes and the Celery workers must share SECRET_KEY (they share
settings anyway).
"""

from __future__ import annotations

import hashlib
import hmac
from pathlib import Path

from django.conf import settings

from posttrain.core.errors import IngestAuthError

TOKEN_FILE_PREFIX = "ingest_token"


def ingest_token(run_id: object) -> str:
    return hmac.new(settings.SECRET_KEY.encode(), f"posttrain-ingest:{run_id}".encode(), hashlib.sha256).hexdigest()


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def token_matches(token: str, stored_hash: str) -> bool:
    """Constant-time comparison of the presented token's sha256 with the stored one."""
    if not stored_hash:
        return False
    return hmac.compare_digest(token_hash(token), stored_hash)


def bearer_token(authorization: str) -> str:
    """The token of an `Authorization: Bearer <token>` header; IngestAuthError 401 for any other header."""
    scheme, _, token = authorization.partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise IngestAuthError("send the run's ingestion token as 'Authorization: Bearer <token>'", status_code=401)
    return token.strip()


def _not_this_runs() -> IngestAuthError:
    return IngestAuthError("this token is not valid for this run", status_code=403)


def require_run_token(authorization: str, stored_hash: str) -> None:
    """The `Authorization: Bearer <token>` header of a request for a run's own endpoints (its events, its rollout
    files' upload) checked against the run's stored hash: IngestAuthError 401 without one, 403 when it is not
    the run's."""
    if not token_matches(bearer_token(authorization), stored_hash):
        raise _not_this_runs()


def require_derived_run_token(authorization: str, run_id: object) -> None:
    """The same check before the run is looked up, against the token derived for this run id: what the web server
    checks before it reads a body (posttrain.core.request_bounds), with no database. Only a holder of SECRET_KEY
    can derive one; the view then checks the run's stored hash as ever."""
    if not hmac.compare_digest(bearer_token(authorization), ingest_token(run_id)):
        raise _not_this_runs()


def token_files_remove(run_dir: str | Path | None) -> int:
    """Removes every token file left in a run folder (its job ended before its engine read one); how many."""
    if not run_dir:
        return 0
    removed = 0
    for path in Path(run_dir).glob(f"{TOKEN_FILE_PREFIX}*"):
        path.unlink(missing_ok=True)
        removed += 1
    return removed
