"""The hostile-request tests' world and stack, shared by every file of tests/security.

The world is a POSTTRAIN_HOME with secrets planted where the platform keeps its own (admin password, secret
key, the embedded database and broker with their sidecars, a log, another run's events), each holding a
marker that must never come back in any answer or log. The admin opened the whole home folder as the import
root (the worst case the issue names: a root that contains the platform's state), so every refusal below is
the resolver's private rule, not merely "outside the roots". `imports/` holds legitimate files and a link to
each secret.

The stack is the real one (uvicorn, the runs worker with beat and the user-code worker, Postgres, Redis), with
short user-code time limits and two loopback ports an admin allowed for reward servers (the test's own server
and an agent endpoint). It has no Ray head: the one test that needs one takes the session's `ray_head`."""

from __future__ import annotations

import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import requests

from tests.conftest import PlatformStack, free_port, platform_stack, postgres_url

SECRET_MARK = f"PLANTED-{secrets.token_hex(6)}"
OUTSIDE = "is outside the server folders an admin opened for imports (POSTTRAIN_IMPORT_ROOTS)"
PRIVATE = "is one of the platform's own files or folders, which no path may name"
SOFT_LIMIT_S, HARD_LIMIT_S = 8, 12


@dataclass
class World:
    home: Path
    imports: Path
    targets: dict[str, Path]  # what a hostile path names: the planted secrets and the host's own files
    reward_server_port: int = field(default_factory=free_port)
    agent_port: int = field(default_factory=free_port)

    @property
    def storage(self) -> Path:
        return self.home / "storage"

    def link_to(self, name: str) -> Path:
        return self.imports / "links" / name

    def expected_refusal(self, named: Path) -> str:
        """The resolver's message for a path naming `named` (directly or through a link)."""
        real = Path(os.path.realpath(named))
        return f"{named} {PRIVATE if real.is_relative_to(self.home) else OUTSIDE}"

    def assert_never_quoted(self, *texts: str) -> None:
        """No planted secret, no line of the host's passwd, not the secret key the servers' environment holds
        (what /proc/self/environ would give)."""
        from django.conf import settings

        for text in texts:
            assert SECRET_MARK not in text
            assert "root:x:0:0" not in text
            assert settings.SECRET_KEY not in text


def _plant(path: Path, what: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"{SECRET_MARK} {what}\n{SECRET_MARK}:x:0:0:{what}:/root:/bin/bash\n")
    return path


@pytest.fixture(scope="session")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    home = tmp_path_factory.mktemp("hostile-home").resolve()
    imports = home / "storage" / "imports"
    imports.mkdir(parents=True)
    other_run = home / "storage" / "runs" / "00000000-0000-4000-8000-0000000000aa"
    targets = {
        "etc-passwd": Path("/etc/passwd"),
        "proc-self-environ": Path("/proc/self/environ"),
        "admin-password": _plant(home / "admin-password", "the admin's password"),
        "secret-key": _plant(home / "secret_key", "the secret key"),
        "log": _plant(home / "logs" / "web.log", "a log"),
        "another-runs-events": _plant(other_run / "events.jsonl", "another run's events"),
        "another-runs-folder": other_run,
    }
    for database in ("posttrain.sqlite3", "celery-broker.sqlite3"):
        for suffix in ("", "-wal", "-shm", "-journal"):
            name = f"{database}{suffix}"
            targets[name] = _plant(home / name, name)
    for name, target in targets.items():
        link = imports / "links" / name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(target)
    return World(home=home, imports=imports, targets=targets)


@pytest.fixture(scope="session")
def stack(django_db_setup, django_db_blocker, world: World) -> Iterator[PlatformStack]:
    from django.conf import settings
    from django.db import connection

    no_ray = f"http://127.0.0.1:{free_port()}"
    env = {
        # The tests mint ingestion tokens in this process: the servers derive the same ones. It is also the
        # secret their /proc/self/environ holds, which no answer may quote.
        "POSTTRAIN_SECRET_KEY": settings.SECRET_KEY,
        "POSTTRAIN_IMPORT_ROOTS": str(world.home),
        "POSTTRAIN_HTTP_ALLOW": f"127.0.0.1:{world.reward_server_port},127.0.0.1:{world.agent_port}",
        "POSTTRAIN_USER_CODE_SOFT_TIME_LIMIT_S": str(SOFT_LIMIT_S),
        "POSTTRAIN_USER_CODE_TIME_LIMIT_S": str(HARD_LIMIT_S),
        "POSTTRAIN_REWARD_TRY_WAIT_S": "60",
    }
    with platform_stack(no_ray, world.home, postgres_url(connection.settings_dict), extra_env=env) as s:
        yield s


class Api:
    """A signed-in API client (token auth, as the CLI and scripts use it) that keeps every answer's text."""

    def __init__(self, base: str, token: str):
        self.base = base
        self.session = requests.Session()
        self.session.headers["Authorization"] = f"Token {token}"
        self.seen: list[str] = []

    def request(self, method: str, path: str, **kwargs) -> requests.Response:
        response = self.session.request(method, f"{self.base}{path}", timeout=120, **kwargs)
        self.seen.append(response.text)
        return response

    def post(self, path: str, body: dict | None = None, **kwargs) -> requests.Response:
        return self.request("POST", path, json=body, **kwargs)

    def get(self, path: str, **kwargs) -> requests.Response:
        return self.request("GET", path, **kwargs)


def api_for(stack: PlatformStack, username: str, *, server_paths: bool = False) -> Api:
    """A researcher's API client; `server_paths`: an admin granted them naming files on the server."""
    from rest_framework.authtoken.models import Token

    from tests.unit.platform.helpers import a_researcher, grant_server_paths

    user = a_researcher(username)
    if server_paths:
        grant_server_paths(user)
    return Api(stack.web.url, Token.objects.create(user=user).key)


def assert_stack_alive(stack: PlatformStack) -> None:
    """The web server and both workers still run, and the web still answers."""
    assert stack.web.process.poll() is None
    assert stack.worker.poll() is None and stack.user_code_worker.poll() is None
    assert requests.get(f"{stack.web.url}/api/health/", timeout=30).status_code in (200, 503)


def server_logs(stack: PlatformStack) -> list[str]:
    return [stack.web.log(), stack.worker_log.read_text(), stack.user_code_log.read_text()]


SMALL_RUN = {
    "algorithm": {"name": "grpo"},
    "rollout": {"prompts_per_step": 2, "samples_per_prompt": 2, "max_new_tokens": 4},
    "train": {"steps": 1, "micro_batch_size": 4},
    "logging": {"eval_every": 0},
}


def registry_rows(world: World, tag: str) -> dict:
    """A model folder, a dataset and a builtin reward inside the import root (legitimate ones), by the ORM."""
    from posttrain.registry.models import Dataset, ModelAsset, RewardFunction
    from tests.unit.platform.helpers import write_model_folder

    data = world.imports / "prompts.jsonl"
    data.write_text('{"prompt": "1+1=", "label": "2"}\n')
    return {
        "model": ModelAsset.objects.create(name=f"model {tag}", path=str(write_model_folder(world.imports / "model"))),
        "dataset": Dataset.objects.create(
            name=f"data {tag}", sha256=tag[:1] * 64, format="jsonl", path=str(data), size_bytes=1, row_count=1
        ),
        "reward": RewardFunction.objects.create(name=f"exact {tag}", kind="builtin", spec={"type": "exact_match"}),
    }


def experiment_body(rows: dict, name: str, config: dict | None = None) -> dict:
    """A POST /api/experiments/ (or validate) body over `registry_rows`."""
    return {
        "name": name,
        "model": rows["model"].pk,
        "dataset": rows["dataset"].pk,
        "rewards": [{"reward": rows["reward"].pk, "weight": 1.0}],
        "config": {**SMALL_RUN, **(config or {})},
    }
