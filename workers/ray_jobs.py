"""Ray Jobs API client for the Celery worker: one Ray job per run attempt, submission id = `Run.ray_job_id`
(the run id; `<run id>-<n>` for the n-th resume after a preemption).

This is the only platform module that imports ray, and only the worker imports it (lazily, from the
services that dispatch). The web process reads job logs over the Jobs HTTP API with urllib instead
(posttrain.telemetry.selectors.run_job_logs).

Code shipping. The engine runs as `ENGINE_PYTHON -m rl_engine train …` on the head node. On a local
head the engine package is importable from the venv (it is pip-installed editable), so no
`working_dir` is uploaded. A remote cluster whose nodes lack the package needs it shipped with the
job: add `"py_modules": [<path of the rl_engine package>]` (or a wheel) to the runtime_env built in
`submit`, and point POSTTRAIN_ENGINE_PYTHON at the cluster's Python; POSTTRAIN_STORAGE must then be
a path the cluster shares (the run folder is written here and read there).
"""

from __future__ import annotations

import os
import secrets
import shlex
from collections.abc import Callable
from functools import lru_cache, wraps
from pathlib import Path
from typing import ParamSpec, TypeVar

from django.conf import settings

from posttrain.core.errors import JobsUnavailable
from posttrain.core.outbound import engine_outbound_env
from posttrain.core.ray_auth import ray_auth_headers, refused_reason
from posttrain.core.run_tokens import TOKEN_FILE_PREFIX, ingest_token
from posttrain.core.server_paths import resolve_run_checkpoint
from posttrain.runs.models import Run
from posttrain.scheduling.rules import run_resources
from rl_engine.spec.jobs import clear_request, request_preemption
from rl_engine.spec.user_code import ALLOW_UNSANDBOXED_ENV

_NOT_FOUND = ("does not exist", "status code 404")
_P = ParamSpec("_P")
_R = TypeVar("_R")


@lru_cache(maxsize=4)
def _client(address: str, authorization: str | None):
    from ray.job_submission import JobSubmissionClient

    return JobSubmissionClient(address, headers={"Authorization": authorization} if authorization else None)


def client():
    """The Jobs API client of settings.RAY_ADDRESS, sending the cluster's token (posttrain.core.ray_auth; a new
    client once the token file holds another token). It checks the address and the token as it is made."""
    return _client(settings.RAY_ADDRESS, ray_auth_headers().get("Authorization"))


def _refusal_waits(call: Callable[_P, _R]) -> Callable[_P, _R]:
    """Ray's 401 or 403 (the platform's token is missing or not the cluster's) is JobsUnavailable: an admin's to
    fix, so a submit waits and is retried meanwhile (a run fails only after POSTTRAIN_RUN_SUBMIT_TIMEOUT_S, with
    this reason), and a reconcile leaves the run as it is."""

    @wraps(call)
    def calling(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        from ray.exceptions import AuthenticationError

        try:
            return call(*args, **kwargs)
        except AuthenticationError as exc:
            status = 401 if str(exc).startswith("Authentication required") else 403
            raise JobsUnavailable(str(refused_reason(status))) from None

    return calling


def _not_found(exc: Exception) -> bool:
    return any(marker in str(exc) for marker in _NOT_FOUND)


def run_dir(run: Run) -> Path:
    config = run.resolved_config
    assert config is not None  # a native run's config is stored when launch creates the run (services.launch)
    return Path(config["logging"]["run_dir"])


def write_config(run: Run) -> Path:
    """`<run dir>/config.yaml`: the run's resolved config, as the engine will read it."""
    from rl_engine.spec.config import dump_config, validate_config

    folder = run_dir(run)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "config.yaml"
    path.write_text(dump_config(validate_config(run.resolved_config)))
    return path


def write_token_file(run: Run) -> Path:
    """The run's ingestion token in a file of this submission's own that only this OS user can read, in the
    run folder (which sandboxed user code never sees); the engine reads it once at start and deletes it. A
    file per submission: one whose job turns out to exist already is removed without touching another's."""
    path = run_dir(run) / f"{TOKEN_FILE_PREFIX}.{secrets.token_hex(8)}"
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as handle:
        handle.write(ingest_token(run.id))
    return path


def entrypoint(run: Run, config_path: Path) -> str:
    parts = [
        settings.ENGINE_PYTHON,
        "-m",
        "rl_engine",
        "train",
        str(config_path),
        "--run-dir",
        str(run_dir(run)),
        "--no-progress",
    ]
    resume = resume_path(run)
    if resume is not None:
        parts += ["--resume", resume]
    # `exec`: the engine replaces Ray's shell, so the job supervisor is its direct parent and the
    # engine's parent-death signal (rl_engine.__main__) fires if the supervisor dies.
    return "exec " + " ".join(shlex.quote(p) for p in parts)


def resume_path(run: Run) -> str | None:
    """Where the engine starts from: after a preemption, the run's own latest checkpoint (the one it wrote
    on its way out; read from the run folder, so it does not depend on the checkpoint event having
    arrived); otherwise the checkpoint the run was launched to resume from, if any."""
    from rl_engine.spec.checkpoints import latest_checkpoint

    if run.attempt:
        own = latest_checkpoint(run_dir(run))
        if own is not None:
            return str(own)
    checkpoint = run.resume_from
    if checkpoint is None:
        return None
    return str(resolve_run_checkpoint("checkpoint", checkpoint.path, checkpoint.run_id))


def engine_threads(run: Run) -> int:
    """torch's and OpenMP's threads in the driver: the CPUs Ray reserves for it (role actors set their own)."""
    from rl_engine.spec.resources import threads_for

    return threads_for(run_resources(run)["driver"]["CPU"])


def engine_env(run: Run, token_path: Path) -> dict[str, str]:
    """The engine's environment: where to post events and where its token is (never the token: Ray shows a
    job's runtime_env to anyone who can list jobs), the outbound policy (rl_engine/outbound.py) and the
    thread/offline settings. Nothing of Ray's authentication: the driver inherits its node's own (RAY_AUTH_MODE,
    RAY_AUTH_TOKEN_PATH), which is what its `ray.init()` needs, and the platform's token never leaves it."""
    env = {
        "POSTTRAIN_RUN_ID": str(run.id),
        "POSTTRAIN_EVENTS_URL": f"{settings.PUBLIC_URL}/api/runs/{run.id}/events",
        "POSTTRAIN_INGEST_TOKEN_FILE": str(token_path),
        **engine_outbound_env(),
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1") if _unscheduled() else str(engine_threads(run)),
        "HF_HUB_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONUNBUFFERED": "1",  # job logs appear while the run goes, not at exit
    }
    if settings.ALLOW_UNSANDBOXED_CODE:
        env[ALLOW_UNSANDBOXED_ENV] = "1"
    return env


def entrypoint_resources(run: Run) -> dict[str, float]:
    """What Ray reserves for the engine's driver: the driver's share of the run's resource needs (the
    hybrid engine's CPUs and GPU; none for actors, whose placement group holds theirs), exactly what
    admission counted. Ray makes a GPU it reserves the driver's only visible one (CUDA_VISIBLE_DEVICES)."""
    driver = run_resources(run)["driver"]
    asked = {"entrypoint_num_cpus": 0.0 if _unscheduled() else driver["CPU"], "entrypoint_num_gpus": driver["GPU"]}
    return {key: value for key, value in asked.items() if value}


def _unscheduled() -> bool:
    """`POSTTRAIN_SCHEDULER=all-at-once` keeps the behaviour from before the scheduler, for bench/queue_admission.py to
    compare against: no CPUs reserved for the driver, and the worker's own OMP_NUM_THREADS for the engine."""
    return settings.SCHEDULER == "all-at-once"


@_refusal_waits
def submit(run: Run) -> str:
    """Submit the run's job. A job with this submission id already existing is success: a retried
    or re-dispatched task must not start a run twice (and writes no token file for it)."""
    try:
        if status(run) is not None:
            return run.ray_job_id
    except RuntimeError as exc:
        raise JobsUnavailable(str(exc)) from exc
    except OSError as exc:
        raise JobsUnavailable(f"{type(exc).__name__}: {exc}") from exc
    config_path = write_config(run)
    clear_request(run_dir(run))  # a preemption asked of an earlier attempt is not this one's
    token_path = write_token_file(run)
    try:
        client().submit_job(
            entrypoint=entrypoint(run, config_path),
            submission_id=run.ray_job_id,
            runtime_env={"env_vars": engine_env(run, token_path)},
            metadata={"posttrain_run": str(run.id), "experiment": str(run.experiment_id), "attempt": str(run.attempt)},
            **entrypoint_resources(run),
        )
    except RuntimeError as exc:
        token_path.unlink(missing_ok=True)  # this submission's job will never read it
        if "already exists" in str(exc):
            return run.ray_job_id
        if _transient(exc):
            raise JobsUnavailable(str(exc)) from exc
        raise
    except OSError as exc:  # connection refused/reset, timeouts (requests' errors are OSErrors)
        token_path.unlink(missing_ok=True)
        raise JobsUnavailable(f"{type(exc).__name__}: {exc}") from exc
    except BaseException:
        token_path.unlink(missing_ok=True)
        raise
    return run.ray_job_id


def preempt(run: Run, reason: str) -> None:
    """Ask the run's engine to checkpoint at its next step boundary and exit (rl_engine/preemption.py): a
    request file in the run folder, which this worker writes as it writes the run's config."""
    request_preemption(run_dir(run), reason)


def _transient(exc: RuntimeError) -> bool:
    """Ray's client reports HTTP failures as RuntimeError("Request failed with status code 5xx: ...");
    a fresh head answers "No available agent to submit job" until its job agent is up."""
    text = str(exc)
    return "status code 5" in text or "No available agent" in text


@_refusal_waits
def stop(run: Run) -> bool:
    """Ask Ray to stop the job (SIGTERM, then SIGKILL); False when there is no such job."""
    try:
        return bool(client().stop_job(run.ray_job_id))
    except RuntimeError as exc:
        if _not_found(exc):
            return False
        raise


@_refusal_waits
def status(run: Run) -> str | None:
    """PENDING, RUNNING, STOPPED, SUCCEEDED or FAILED; None when Ray has no job for the run."""
    try:
        return str(client().get_job_status(run.ray_job_id).value)
    except RuntimeError as exc:
        if _not_found(exc):
            return None
        raise


@_refusal_waits
def exit_code(run: Run) -> int | None:
    """The driver's exit code once its job ended (negative: killed by that signal); None when Ray has none
    (no such job, or the job failed before or around its driver, e.g. its supervisor died)."""
    try:
        code = client().get_job_info(run.ray_job_id).driver_exit_code
    except RuntimeError as exc:
        if _not_found(exc):
            return None
        raise
    return None if code is None else int(code)


@_refusal_waits
def logs(run: Run) -> str:
    try:
        return client().get_job_logs(run.ray_job_id)
    except RuntimeError as exc:
        if _not_found(exc):
            return ""
        raise
