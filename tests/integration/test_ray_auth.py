"""Ray behind the cluster's token, on the session's real Ray head (tests/conftest.py starts it with token
authentication, as `make demo` starts its own; docs/SECURITY.md, "Ray"): a job the platform's client submits with
the token runs, and its driver reaches the cluster from inside, as the engine's `ray.init()` does, with nothing of
the token in its runtime_env; a job submitted without the token, or with a wrong one, is refused, and so is a
driver that connects to the GCS without it. Nothing of the token reaches Ray's logs."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import time
import urllib.error
import urllib.request
import uuid
from pathlib import Path

import pytest

from tests.support.stack import RayHead, ray_get_json

pytestmark = pytest.mark.slow

JOB_TIMEOUT_S = 120

# What a run's engine does inside its job (rl_engine/distributed/driver.py): join the job's cluster and use it.
DRIVER = (
    "import os, ray\n"
    "ray.init(address=os.environ.get('RAY_ADDRESS'), include_dashboard=False, configure_logging=False)\n"
    "print('the cluster answered', ray.get(ray.remote(lambda: 42).remote()))\n"
    "print('token in the environment:', 'RAY_AUTH_TOKEN' in os.environ)\n"
)


def refused_status(url: str, method: str = "GET", headers: dict[str, str] | None = None, body=None) -> int:
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method, headers={"Content-Type": "application/json"})
    for name, value in (headers or {}).items():
        request.add_header(name, value)
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(request, timeout=10)
    return refused.value.code


def wait_for_end(client, job_id: str) -> str:
    deadline = time.monotonic() + JOB_TIMEOUT_S
    while True:
        status = str(client.get_job_status(job_id).value)
        if status in ("SUCCEEDED", "FAILED", "STOPPED") or time.monotonic() > deadline:
            return status
        time.sleep(0.5)


def test_a_job_with_the_token_runs_and_reaches_ray_from_inside_one_without_it_is_refused(
    ray_head_server: RayHead, settings, tmp_path: Path
):
    from ray.exceptions import AuthenticationError
    from ray.job_submission import JobSubmissionClient

    from workers import ray_jobs

    address = ray_head_server.address
    settings.RAY_ADDRESS = address
    token = settings.RAY_TOKEN_FILE.read_text().strip()

    # With the token (the platform's client, as the worker submits runs): the job runs, and its driver joins the
    # cluster on the head's own settings, inherited, with nothing of Ray's authentication in its runtime_env.
    client = ray_jobs.client()
    job_id = client.submit_job(
        entrypoint=f"{shlex.quote(sys.executable)} -c {shlex.quote(DRIVER)}", runtime_env={"env_vars": {"X": "1"}}
    )
    status = wait_for_end(client, job_id)
    logs = client.get_job_logs(job_id)
    assert status == "SUCCEEDED", logs
    assert "the cluster answered 42" in logs and "token in the environment: False" in logs
    job = ray_get_json(f"{address}/api/jobs/{job_id}")
    assert job["runtime_env"]["env_vars"] == {"X": "1"} and token not in json.dumps(job)

    # Without it, or with a wrong one: refused before anything runs (the ShadowRay way in is closed).
    planted = tmp_path / f"ran-{uuid.uuid4().hex}"
    attack = {"entrypoint": f"touch {planted}"}
    assert refused_status(f"{address}/api/jobs/", "POST", body=attack) == 401
    assert refused_status(f"{address}/api/jobs/", "POST", {"Authorization": "Bearer " + "0" * 64}, attack) == 403
    assert refused_status(f"{address}/api/jobs/") == 401  # nor may anyone list the jobs and their environments
    with pytest.raises(AuthenticationError):
        JobSubmissionClient(address, headers={"Authorization": "Bearer " + "0" * 64})
    assert [j for j in ray_get_json(f"{address}/api/jobs/") if j["entrypoint"] == attack["entrypoint"]] == []
    assert not planted.exists()

    # Nor can a driver join through the GCS port without the token (HOME elsewhere: no token of Ray's own there;
    # one connection attempt, not Ray's twenty).
    gcs = f"127.0.0.1:{ray_head_server.gcs_port}"
    joined = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init(address={gcs!r}); print('joined')"],
        env={
            **{k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH_TOKEN")},
            "RAY_AUTH_MODE": "disabled",
            "RAY_gcs_server_port_wait_time_s": "1",
            "HOME": str(tmp_path),
        },
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert joined.returncode != 0 and "joined" not in joined.stdout
    assert "InvalidAuthToken" in joined.stderr or "Authentication" in joined.stderr, joined.stderr[-2000:]

    assert_nothing_of_the_token_in_rays_logs(ray_head_server, token)


def assert_nothing_of_the_token_in_rays_logs(head: RayHead, token: str) -> None:
    """The head's own output and every log of its session (GCS, raylet, dashboard, agents, the jobs' drivers)."""
    logs = [head.log, *(p for p in (head.temp_dir / "session_latest" / "logs").rglob("*") if p.is_file())]
    assert len(logs) > 5
    found = [str(path) for path in logs if token.encode() in path.read_bytes()]
    assert found == []
