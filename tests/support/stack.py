"""The real stack's servers, started by the tests that need them: free ports, a Ray head, uvicorn serving the
app, Celery workers, the whole platform (`platform_stack`), and the paths and environment they share.
tests/conftest.py's fixtures start them for the session; a module that needs its own stack calls them."""

from __future__ import annotations

import atexit
import json
import os
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from bench._servers import demo_web_flags

REPO_ROOT = Path(__file__).resolve().parents[2]
VENV_BIN = Path(sys.executable).parent


def redis_database(url: str, number: int | None = None, *, offset: int = 0) -> str | None:
    """`redis://host:port/N` on database `number` (default: N + `offset`); None for a URL that is not Redis."""
    match = re.fullmatch(r"(redis://[^/]+)(?:/(\d+))?", url)
    if not match:
        return None
    return f"{match.group(1)}/{number if number is not None else int(match.group(2) or 0) + offset}"


def redis_url_for_worker(url: str, worker: str) -> str:
    """`redis://host:port/N` becomes database N + 1 + the worker's number (gw0 on N + 1, gw1 on N + 2)."""
    moved = redis_database(url, offset=1 + int(worker[2:])) if worker.startswith("gw") else None
    return moved or url


# What a one-process DeepSpeed trainer sets in its own process (rl_engine.backends.deepspeed_trainer): a world
# of one whose port the test process then holds: a subprocess a test starts must not inherit it.
DISTRIBUTED_LAUNCHER_VARIABLES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for_http(url: str, timeout_s: float, process: subprocess.Popen | None = None) -> None:
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        if process is not None and process.poll() is not None:
            raise RuntimeError(f"process for {url} exited with {process.returncode}")
        try:
            with urllib.request.urlopen(url, timeout=2):
                return
        except urllib.error.HTTPError:
            return  # it answered
        except Exception as exc:  # not up yet
            last_error = exc
            time.sleep(0.3)
    raise TimeoutError(f"{url} did not answer within {timeout_s}s: {last_error}")


# A Ray process group (`ray start --block`: GCS, raylet, autoscaler monitor, agents) outlasts 20 s of SIGTERM
# here, so each stop waited 20 s and then killed it anyway. Nothing of a test's cluster is kept, so a head or
# node gets a short grace and is then killed, as Ray's own `ray stop` does after its grace period.
RAY_STOP_GRACE_S = 3.0


def stop_process_group(process: subprocess.Popen, timeout_s: float = 20) -> None:
    if process.poll() is not None:
        return
    os.killpg(process.pid, 15)
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, 9)
        process.wait()


def make_ray_token_file() -> Path:
    """A token for the test session's Ray clusters, in a private folder of its own (0700, the file 0600), as the
    platform keeps its own next to the secret key; removed when the session's process exits."""
    folder = Path(tempfile.mkdtemp(prefix="pt-ray-token-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    path = folder / "ray_token"
    path.write_text(secrets.token_hex(32))
    path.chmod(0o600)
    return path


def ray_node_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a `ray start` the tests run: token authentication with the session's token file
    (POSTTRAIN_RAY_TOKEN_FILE, which tests/conftest.py sets and the platform's stacks read too), as `make demo`
    starts its head. Never RAY_AUTH_TOKEN, which would take precedence over the file."""
    env = {key: value for key, value in (env or os.environ).items() if key != "RAY_AUTH_TOKEN"}
    return {**env, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": env["POSTTRAIN_RAY_TOKEN_FILE"]}


def ray_headers() -> dict[str, str]:
    """The session's token as Ray's HTTP API wants it, for a test that reads Ray's jobs itself."""
    return {"Authorization": f"Bearer {Path(os.environ['POSTTRAIN_RAY_TOKEN_FILE']).read_text().strip()}"}


def ray_get_json(url: str, timeout_s: float = 10) -> Any:
    """GET one of Ray's dashboard URLs with the session's token."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=ray_headers()), timeout=timeout_s) as response:
        return json.load(response)


def tiny_demo_assets(tmp_path_factory: pytest.TempPathFactory, name: str) -> Path:
    """The demo task at its smallest (tiny model, short warm start): what a test run trains on."""
    from rl_engine.demo.build import build_demo

    out = tmp_path_factory.mktemp(name)
    build_demo(out, seed=0, model_size="tiny", sft_steps=10, progress=False)
    return out


class RayHead:
    """A real local Ray head on fixed ports: `kill()` then `start()` is a crash of the head and a restart on
    the same address (a fresh cluster: Ray keeps no jobs across it)."""

    def __init__(self, log: Path):
        self.gcs_port, self.dashboard_port, self.agent_port = free_port(), free_port(), free_port()
        self.temp_dir = Path(f"/tmp/pt-ray-test-{os.getpid()}")
        self.log = log
        self.address = f"http://127.0.0.1:{self.dashboard_port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 120) -> None:
        self.process = subprocess.Popen(
            [
                str(VENV_BIN / "ray"),
                "start",
                "--head",
                "--block",
                "--port",
                str(self.gcs_port),
                "--dashboard-host",
                "127.0.0.1",
                "--dashboard-port",
                str(self.dashboard_port),
                # its own job-agent port: a second head (the demo stack test) must not collide on Ray's 52365
                "--dashboard-agent-listen-port",
                str(self.agent_port),
                "--num-cpus",
                "2",
                "--temp-dir",
                str(self.temp_dir),
                "--disable-usage-stats",
            ],
            env=ray_node_env(),
            stdout=self.log.open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_http(f"{self.address}/api/version", timeout_s=timeout_s, process=self.process)

    def kill(self) -> None:
        """SIGKILL the head's whole process group (GCS, raylet, dashboard and the jobs they run)."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 9)
            self.process.wait()
        self.process = None

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process, timeout_s=RAY_STOP_GRACE_S)
            self.process = None


def postgres_url(settings_dict: dict) -> str:
    """A DATABASE_URL for the database Django is using (the test database, inside a test session), so
    servers started by the tests read what the tests write."""
    if settings_dict["ENGINE"] != "django.db.backends.postgresql":
        pytest.fail(
            "this test needs DATABASE_URL pointing at Postgres (servers read the test database); use `make test`"
        )
    user = settings_dict.get("USER") or "postgres"
    password = f":{settings_dict['PASSWORD']}" if settings_dict.get("PASSWORD") else ""
    host = settings_dict.get("HOST") or "127.0.0.1"
    port = settings_dict.get("PORT") or 5432
    return f"postgres://{user}{password}@{host}:{port}/{settings_dict['NAME']}"


class UvicornServer:
    """The ASGI app under uvicorn, as `make demo` serves it (scripts/demo.sh's WEB_FLAGS), on a fixed port: it can be stopped and
    started again on the same address (an outage of the web server, as the engine sees it)."""

    def __init__(self, env: dict[str, str], log_path: Path, port: int | None = None):
        self.env = env
        self.log_path = log_path
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen | None = None

    def start(self, timeout_s: float = 60) -> None:
        self.process = subprocess.Popen(
            [
                str(VENV_BIN / "uvicorn"),
                "--app-dir",
                str(REPO_ROOT / "platform"),
                "posttrain.asgi:application",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *demo_web_flags(),  # the demo's parser and limits
            ],
            cwd=REPO_ROOT,
            env=self.env,
            stdout=self.log_path.open("a"),
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for_http(f"{self.url}/login/", timeout_s=timeout_s, process=self.process)

    def stop(self) -> None:
        if self.process is not None:
            stop_process_group(self.process)
            self.process = None

    def log(self) -> str:
        return self.log_path.read_text() if self.log_path.exists() else ""


@dataclass
class PlatformStack:
    """The whole product on real servers: uvicorn (pages, API, the engine's event endpoint), a Celery worker
    with beat for runs and one for user code (its own queue, as `make demo` starts them), on the test
    database, the Redis broker and pub/sub, and a real Ray head."""

    web: UvicornServer
    worker: subprocess.Popen
    worker_log: Path
    ray: str
    storage: Path
    worker_env: dict[str, str]
    user_code_worker: subprocess.Popen
    user_code_log: Path


USER_CODE_QUEUE = "user_code"


def start_celery_worker(
    env: dict[str, str],
    log_path: Path,
    schedule: Path,
    *,
    purge: bool = False,
    timeout_s: float = 90,
    queue: str = "celery",
) -> subprocess.Popen:
    """A Celery worker once it says `ready.`: for the default queue with beat (-B: the periodic reconcile runs
    as in production), or for `user_code` in a prefork child (Celery's time limits kill those). `purge` empties
    its queue first (a fresh stack), a replacement worker keeps what is queued."""
    log_path.write_text("")
    if queue == USER_CODE_QUEUE:
        pool = ["--pool", "prefork", "--concurrency", "1", "-n", f"user_code-{os.getpid()}@%h"]
    else:
        pool = ["-B", "--pool", "solo", "--schedule", str(schedule), "-n", f"runs-{os.getpid()}@%h"]
    worker = subprocess.Popen(
        [
            str(VENV_BIN / "celery"),
            "-A",
            "workers.celery_app",
            "worker",
            "-Q",
            queue,
            *pool,
            "--loglevel",
            "INFO",
            "--without-gossip",
            "--without-mingle",
            *(["--purge"] if purge else []),
        ],
        cwd=REPO_ROOT,
        env=env,
        stdout=log_path.open("a"),
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    deadline = time.monotonic() + timeout_s
    while "ready." not in log_path.read_text():
        if worker.poll() is not None or time.monotonic() > deadline:
            stop_process_group(worker)
            pytest.fail(f"the Celery worker did not start:\n{log_path.read_text()[-3000:]}")
        time.sleep(0.3)
    return worker


@contextmanager
def platform_stack(
    ray_address: str,
    home: Path,
    database_url: str,
    extra_env: dict[str, str] | None = None,
) -> Iterator[PlatformStack]:
    redis_url = os.environ.get("REDIS_URL")
    if not redis_url:
        pytest.fail("this test needs REDIS_URL; run it with `make test`")
    env = {
        **os.environ,
        "DATABASE_URL": database_url,
        "POSTTRAIN_HOME": str(home),
        "POSTTRAIN_STORAGE": str(home / "storage"),
        "POSTTRAIN_SECRET_KEY": secrets.token_urlsafe(32),  # web and worker derive the same ingest tokens
        "REDIS_URL": redis_url,
        "CELERY_BROKER_URL": redis_url,
        "PUBSUB_BACKEND": "redis",
        "RAY_ADDRESS": ray_address,
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        **(extra_env or {}),
    }
    web = UvicornServer(env, home / "uvicorn.log")
    web.start()
    worker_env = {**env, "POSTTRAIN_PUBLIC_URL": web.url, "POSTTRAIN_RUN_RECONCILE_INTERVAL_S": "2"}
    worker_log = home / "worker.log"
    user_code_log = home / "user-code-worker.log"
    try:
        worker = start_celery_worker(worker_env, worker_log, home / "celerybeat-schedule", purge=True)
        try:
            user_code = start_celery_worker(
                worker_env, user_code_log, home / "celerybeat-schedule", purge=True, queue=USER_CODE_QUEUE
            )
            try:
                yield PlatformStack(
                    web=web,
                    worker=worker,
                    worker_log=worker_log,
                    ray=ray_address,
                    storage=home / "storage",
                    worker_env=worker_env,
                    user_code_worker=user_code,
                    user_code_log=user_code_log,
                )
            finally:
                stop_process_group(user_code)
        finally:
            stop_process_group(worker)
            forget_what_the_worker_wrote_unasked(database_url)
    finally:
        web.stop()


def forget_what_the_worker_wrote_unasked(database_url: str) -> None:
    """The worker samples the cluster and runs an admission pass at every reconcile (every 2 s here), also after
    the last test's clean-up and before this teardown: the samples and the one ClusterSnapshot row (pk 1) are
    rows no test wrote, which would join a later test's history or collide with a snapshot it sets."""
    from posttrain.scheduling.models import ClusterSample, ClusterSnapshot

    try:
        with psycopg.connect(database_url, autocommit=True, connect_timeout=5) as connection:
            for model in (ClusterSample, ClusterSnapshot):
                connection.execute(f"DELETE FROM {model._meta.db_table}")
    except psycopg.OperationalError:
        pass  # the database is down (a fault test): nothing was sampled into it meanwhile


def stop_ray_jobs(ray_address: str) -> None:
    """Stops every pending or running Ray job (a failed test must not leave an engine running)."""
    for job in ray_get_json(f"{ray_address}/api/jobs/"):
        if job.get("submission_id") and job.get("status") in ("PENDING", "RUNNING"):
            request = urllib.request.Request(
                f"{ray_address}/api/jobs/{job['submission_id']}/stop", method="POST", headers=ray_headers()
            )
            urllib.request.urlopen(request, timeout=10).close()
