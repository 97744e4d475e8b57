"""How the platform proves itself to Ray (docs/SECURITY.md, "Ray"): the cluster's token, sent as
`Authorization: Bearer` with every request to its dashboard and Jobs API.

The web process (health, job logs) and the Celery worker (job submission, the scheduler's cluster reads) read
the token from settings.RAY_TOKEN_FILE at each use, so a token replaced on disk is used without a restart, and
never hold it anywhere else: not in an environment, a log or a job's runtime_env. The engine inside a job gets
nothing from the platform: a job's driver inherits its node's own Ray settings (RAY_AUTH_MODE and
RAY_AUTH_TOKEN_PATH, as the head or node was started with), which is how `ray.init()` in a job reaches the
cluster. This module never imports ray: the web process does not.
"""

from __future__ import annotations

import urllib.request

from django.conf import settings

from posttrain.core.errors import JobsUnavailable

# What the platform's processes log at every start when an admin turned Ray's token authentication off, and
# /api/health/ warns whenever the Ray head says it enforces none.
DISABLED_WARNING = (
    "Ray's token authentication is off: anyone who can reach the Ray head's dashboard or GCS port can submit a "
    'job and run code as the platform (RAY_AUTH_MODE=token turns it on; docs/SECURITY.md, "Ray")'
)
_TOKEN_SETTINGS = "RAY_AUTH_MODE and POSTTRAIN_RAY_TOKEN_FILE"


class RayTokenUnavailable(JobsUnavailable):
    """The token file cannot be read or is empty: every request to a token-authenticated cluster would be
    refused. A submit waits and is retried meanwhile, as for a cluster that does not answer."""


def ray_token() -> str:
    """The cluster's token, read from its file now (the message names the setting, never the token)."""
    try:
        token = settings.RAY_TOKEN_FILE.read_text().strip()
    except OSError as exc:
        raise RayTokenUnavailable(
            f"the Ray token file (POSTTRAIN_RAY_TOKEN_FILE) cannot be read: {exc.strerror or type(exc).__name__}"
        ) from None
    if not token:
        raise RayTokenUnavailable("the Ray token file (POSTTRAIN_RAY_TOKEN_FILE) is empty")
    return token


def ray_auth_headers() -> dict[str, str]:
    """The headers of a request to Ray's dashboard or Jobs API: the token, unless an admin turned auth off."""
    if settings.RAY_AUTH_MODE != "token":
        return {}
    return {"Authorization": f"Bearer {ray_token()}"}


def ray_request(url: str) -> urllib.request.Request:
    """A GET of one of Ray's dashboard URLs, with the token (urllib: the web process's way to Ray)."""
    return urllib.request.Request(url, headers=ray_auth_headers())


def refused_reason(status: int) -> str | None:
    """What Ray's 401 (no token) or 403 (a wrong one) means for the platform; None for any other status."""
    if status == 401:
        return f"Ray asked for a token the platform did not send (401): check {_TOKEN_SETTINGS}"
    if status == 403:
        return f"Ray refused the platform's token (403): check {_TOKEN_SETTINGS}"
    return None
