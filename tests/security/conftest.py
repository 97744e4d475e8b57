"""The hostile-request tests' world and stack, shared by every file of tests/security.

The world is a POSTTRAIN_HOME with secrets planted where the platform keeps its own (admin password, secret
key, the embedded database and broker with their sidecars, a log, another run's events), each holding a
marker that must never come back in any answer or log. The admin opened the whole home folder as the import
root (the worst case the issue names: a root that contains the platform's state), so every refusal below is
the resolver's private rule, not merely "outside the roots". `imports/` holds legitimate files and a link to
each secret.

The stack is the real one (uvicorn, the runs worker with beat and the user-code worker, Postgres, Redis), with
short user-code time limits and two loopback ports an admin allowed for reward servers (the test's own server
and an agent endpoint). It has no Ray head: the one test that needs one takes the session's `ray_head`.

The helpers that are not fixtures (World, the API client, the checks) are tests/security/helpers.py's."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.security.helpers import HARD_LIMIT_S, SECRET_MARK, SOFT_LIMIT_S, World
from tests.support.stack import PlatformStack, platform_stack, postgres_url


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


@pytest.fixture(scope="package")
def stack(django_db_setup, django_db_blocker, world: World) -> Iterator[PlatformStack]:
    """The stack the hostile tests aim at, with no Ray cluster. Package scope: its Celery worker (with beat) must
    not outlive these tests and write into the database under the unit tests that run next on this worker."""
    from django.conf import settings
    from django.db import connection

    # The discard port, which nothing here serves: a free port could later be a Ray head's dashboard (another
    # fixture's free port), and then this worker's periodic admission would sample that cluster.
    no_ray = "http://127.0.0.1:9"
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
